//! The KV service's requests as builders (ranges, puts, deletes, transactions and their
//! compares) and read accessors on its answers.

use super::generated::etcdserverpb as pb;
use super::generated::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use super::generated::etcdserverpb::request_op::Request;
use super::generated::etcdserverpb::response_op::Response;

/// The header of every answer: the cluster, the member and the revision it answered at.
pub type ResponseHeader = pb::ResponseHeader;
/// A key, its value and its revisions.
pub type KeyValue = super::generated::mvccpb::KeyValue;
/// The answer to a range read (a get).
pub type GetResponse = pb::RangeResponse;
/// The answer to a put.
pub type PutResponse = pb::PutResponse;
/// The answer to a delete.
pub type DeleteResponse = pb::DeleteRangeResponse;
/// The answer to a transaction.
pub type TxnResponse = pb::TxnResponse;

impl pb::ResponseHeader {
    /// The id of the cluster that answered.
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// The store's revision when the request was applied (or read).
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl KeyValue {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The value as UTF-8.
    ///
    /// # Errors
    /// When the value is not UTF-8.
    pub fn value_str(&self) -> std::result::Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.value)
    }

    /// The revision of the key's last change.
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    /// The revision at which the key was created.
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    /// The etcd lease the key is attached to; 0 for none.
    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl pb::RangeResponse {
    /// The header, absent only from a malformed answer.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// The keys read, in key order.
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }

    /// Whether the range held more keys than the limit let through.
    pub fn more(&self) -> bool {
        self.more
    }

    /// How many keys the range holds.
    pub fn count(&self) -> i64 {
        self.count
    }
}

impl pb::TxnResponse {
    /// The header, absent only from a malformed answer.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }

    /// Whether every compare held (the `and_then` branch ran, not the `or_else` one).
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }

    /// The answers of the branch that ran, one per operation, in order.
    pub fn op_responses(&self) -> Vec<TxnOpResponse> {
        self.responses
            .iter()
            .filter_map(|op| op.response.clone())
            .map(|response| match response {
                Response::ResponseRange(r) => TxnOpResponse::Get(r),
                Response::ResponsePut(r) => TxnOpResponse::Put(r),
                Response::ResponseDeleteRange(r) => TxnOpResponse::Delete(r),
                Response::ResponseTxn(r) => TxnOpResponse::Txn(r),
            })
            .collect()
    }
}

/// One operation's answer in a transaction.
#[derive(Debug, Clone)]
pub enum TxnOpResponse {
    /// A range read's.
    Get(GetResponse),
    /// A put's.
    Put(PutResponse),
    /// A delete's.
    Delete(DeleteResponse),
    /// A nested transaction's.
    Txn(TxnResponse),
}

/// What a range read returns beside its first key.
#[derive(Debug, Default, Clone)]
pub struct GetOptions(pb::RangeRequest);

impl GetOptions {
    /// Reads the one key, at the latest revision.
    pub fn new() -> GetOptions {
        GetOptions::default()
    }

    /// Reads `[key, end)`.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> GetOptions {
        self.0.range_end = end.into();
        self
    }

    /// At most `limit` keys (0: no limit).
    pub fn with_limit(mut self, limit: i64) -> GetOptions {
        self.0.limit = limit;
        self
    }

    /// Keys without their values.
    pub fn with_keys_only(mut self) -> GetOptions {
        self.0.keys_only = true;
        self
    }

    /// Only how many keys the range holds.
    pub fn with_count_only(mut self) -> GetOptions {
        self.0.count_only = true;
        self
    }

    /// As of `revision` (0: the latest).
    pub fn with_revision(mut self, revision: i64) -> GetOptions {
        self.0.revision = revision;
        self
    }

    /// The request for `key`.
    pub(crate) fn request(self, key: impl Into<Vec<u8>>) -> pb::RangeRequest {
        pb::RangeRequest {
            key: key.into(),
            ..self.0
        }
    }
}

/// What a put does beside writing its key.
#[derive(Debug, Default, Clone)]
pub struct PutOptions(pb::PutRequest);

impl PutOptions {
    /// A plain put.
    pub fn new() -> PutOptions {
        PutOptions::default()
    }

    /// Attaches the key to etcd lease `lease`: etcd deletes it when the lease expires.
    pub fn with_lease(mut self, lease: i64) -> PutOptions {
        self.0.lease = lease;
        self
    }
}

/// What a delete removes beside its first key.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions(pb::DeleteRangeRequest);

impl DeleteOptions {
    /// Deletes the one key.
    pub fn new() -> DeleteOptions {
        DeleteOptions::default()
    }

    /// Deletes `[key, end)`.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> DeleteOptions {
        self.0.range_end = end.into();
        self
    }
}

/// How a compare relates the key's target to the given value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// The target equals the value.
    Equal,
    /// The target is greater.
    Greater,
    /// The target is less.
    Less,
    /// The target differs.
    NotEqual,
}

/// A condition of a transaction on one key.
#[derive(Debug, Clone)]
pub struct Compare(pb::Compare);

impl Compare {
    fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: TargetUnion) -> Compare {
        let result = match op {
            CompareOp::Equal => CompareResult::Equal,
            CompareOp::Greater => CompareResult::Greater,
            CompareOp::Less => CompareResult::Less,
            CompareOp::NotEqual => CompareResult::NotEqual,
        };
        let kind = match target {
            TargetUnion::Version(_) => CompareTarget::Version,
            TargetUnion::CreateRevision(_) => CompareTarget::Create,
            TargetUnion::ModRevision(_) => CompareTarget::Mod,
            TargetUnion::Value(_) => CompareTarget::Value,
            TargetUnion::Lease(_) => CompareTarget::Lease,
        };
        Compare(pb::Compare {
            result: result as i32,
            target: kind as i32,
            key: key.into(),
            range_end: Vec::new(),
            target_union: Some(target),
        })
    }

    /// Compares the key's version (how often it was written since created; 0: absent).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Compare {
        Compare::new(key, op, TargetUnion::Version(version))
    }

    /// Compares the revision the key was created at (0: absent).
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, TargetUnion::CreateRevision(revision))
    }

    /// Compares the revision of the key's last change (0: absent).
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::new(key, op, TargetUnion::ModRevision(revision))
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub struct TxnOp(Request);

impl TxnOp {
    /// Reads `key` (and the range `options` give).
    pub fn get(key: impl Into<Vec<u8>>, options: Option<GetOptions>) -> TxnOp {
        TxnOp(Request::RequestRange(
            options.unwrap_or_default().request(key),
        ))
    }

    /// Writes `value` at `key`.
    pub fn put(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        options: Option<PutOptions>,
    ) -> TxnOp {
        TxnOp(Request::RequestPut(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            ..options.unwrap_or_default().0
        }))
    }

    /// Deletes `key` (and the range `options` give).
    pub fn delete(key: impl Into<Vec<u8>>, options: Option<DeleteOptions>) -> TxnOp {
        TxnOp(Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.into(),
            ..options.unwrap_or_default().0
        }))
    }

    /// A nested transaction.
    pub fn txn(txn: Txn) -> TxnOp {
        TxnOp(Request::RequestTxn(txn.0))
    }
}

/// A transaction: if every compare holds, the `and_then` operations, else the `or_else` ones,
/// applied atomically at one revision.
#[derive(Debug, Default, Clone)]
pub struct Txn(pb::TxnRequest);

fn ops(ops: impl Into<Vec<TxnOp>>) -> Vec<pb::RequestOp> {
    ops.into()
        .into_iter()
        .map(|op| pb::RequestOp {
            request: Some(op.0),
        })
        .collect()
}

impl Txn {
    /// An empty transaction (no compares: the `and_then` branch runs).
    pub fn new() -> Txn {
        Txn::default()
    }

    /// The compares that choose the branch.
    pub fn when(mut self, compares: impl Into<Vec<Compare>>) -> Txn {
        self.0.compare = compares.into().into_iter().map(|c| c.0).collect();
        self
    }

    /// The operations applied when every compare holds.
    pub fn and_then(mut self, operations: impl Into<Vec<TxnOp>>) -> Txn {
        self.0.success = ops(operations);
        self
    }

    /// The operations applied when a compare fails.
    pub fn or_else(mut self, operations: impl Into<Vec<TxnOp>>) -> Txn {
        self.0.failure = ops(operations);
        self
    }

    pub(crate) fn into_request(self) -> pb::TxnRequest {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_txn_carries_its_compares_and_both_branches() {
        let txn = Txn::new()
            .when([Compare::mod_revision("k", CompareOp::Equal, 7)])
            .and_then([
                TxnOp::put("k", "v", Some(PutOptions::new().with_lease(9))),
                TxnOp::delete("a", Some(DeleteOptions::new().with_range("b"))),
            ])
            .or_else([TxnOp::get("k", Some(GetOptions::new().with_count_only()))])
            .into_request();
        let compare = &txn.compare[0];
        assert_eq!(
            (compare.key.as_slice(), compare.result, compare.target),
            (
                &b"k"[..],
                CompareResult::Equal as i32,
                CompareTarget::Mod as i32
            )
        );
        assert_eq!(compare.target_union, Some(TargetUnion::ModRevision(7)));
        assert!(matches!(
            &txn.success[0].request,
            Some(Request::RequestPut(p)) if p.key == b"k" && p.value == b"v" && p.lease == 9
        ));
        assert!(matches!(
            &txn.success[1].request,
            Some(Request::RequestDeleteRange(d)) if d.key == b"a" && d.range_end == b"b"
        ));
        assert!(matches!(
            &txn.failure[0].request,
            Some(Request::RequestRange(r)) if r.key == b"k" && r.count_only
        ));
    }
}
