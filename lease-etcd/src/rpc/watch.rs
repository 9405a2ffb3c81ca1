//! The Watch service: one watch per stream, its events, and its end when the stream is
//! dropped.

use tokio::sync::mpsc;
use tonic::codec::Streaming;

use super::generated::etcdserverpb as pb;
use super::generated::etcdserverpb::watch_create_request::FilterType;
use super::generated::etcdserverpb::watch_request::RequestUnion;
use super::kv::{KeyValue, ResponseHeader};

/// What a watch event did to its key.
pub type EventType = super::generated::mvccpb::event::EventType;
/// One change to a watched key.
pub type Event = super::generated::mvccpb::Event;
/// One answer on a watch stream: its creation, its cancellation, or events.
pub type WatchResponse = pb::WatchResponse;

impl Event {
    /// Whether the key was put or deleted (an unknown kind reads as a put).
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }

    /// The key as the event left it (for a delete: the key, at the revision of its deletion).
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
}

impl pb::WatchResponse {
    /// The header, absent only from a malformed answer.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The answer to the creation request.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The watch ended (compacted past its start, refused, or cancelled): no more events
    /// come on it.
    pub fn canceled(&self) -> bool {
        self.canceled
    }

    /// Why etcd ended the watch.
    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }

    /// The events, in revision order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
}

/// Events a watch leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFilterType {
    /// Puts.
    NoPut,
    /// Deletes.
    NoDelete,
}

/// What a watch covers beside its key.
#[derive(Debug, Default, Clone)]
pub struct WatchOptions {
    request: pb::WatchCreateRequest,
    prefix: bool,
}

impl WatchOptions {
    /// Watches the one key, from now on.
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }

    /// Watches every key starting with the key.
    pub fn with_prefix(mut self) -> WatchOptions {
        self.prefix = true;
        self
    }

    /// Leaves out the events of `filters`' kinds.
    pub fn with_filters(mut self, filters: impl Into<Vec<WatchFilterType>>) -> WatchOptions {
        self.request.filters = filters
            .into()
            .into_iter()
            .map(|f| match f {
                WatchFilterType::NoPut => FilterType::Noput as i32,
                WatchFilterType::NoDelete => FilterType::Nodelete as i32,
            })
            .collect();
        self
    }

    /// The creation request for `key`.
    pub(crate) fn request(self, key: Vec<u8>) -> pb::WatchRequest {
        let range_end = if self.prefix {
            crate::codec::prefix_end(&key)
        } else {
            Vec::new()
        };
        pb::WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
                key,
                range_end,
                ..self.request
            })),
        }
    }
}

/// A watch: its answers, in order. Dropping it closes the stream, which ends the watch on
/// the member.
#[derive(Debug)]
pub struct WatchStream {
    /// Keeps the request half open while the watch is wanted: etcd reads a closed one as the
    /// client leaving.
    _requests: mpsc::Sender<pb::WatchRequest>,
    responses: Streaming<pb::WatchResponse>,
}

impl WatchStream {
    pub(crate) fn new(
        requests: mpsc::Sender<pb::WatchRequest>,
        responses: Streaming<pb::WatchResponse>,
    ) -> WatchStream {
        WatchStream {
            _requests: requests,
            responses,
        }
    }

    /// The next answer; `None` once the stream ended.
    ///
    /// # Errors
    /// When the stream broke (the member went away, the connection was cut).
    pub async fn message(&mut self) -> super::Result<Option<WatchResponse>> {
        Ok(self.responses.message().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_watch_ranges_over_the_prefix_with_its_filters() {
        let request = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoDelete])
            .request(b"ns\0w\0".to_vec());
        let Some(RequestUnion::CreateRequest(create)) = request.request_union else {
            panic!("not a creation request");
        };
        assert_eq!(create.key, b"ns\0w\0");
        assert_eq!(create.range_end, b"ns\0w\x01");
        assert_eq!(create.filters, [FilterType::Nodelete as i32]);
    }
}
