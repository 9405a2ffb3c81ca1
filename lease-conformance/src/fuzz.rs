//! Shared pieces of the input fuzzing: the proptest settings every fuzz test runs with, and the
//! generator of store URLs near the valid ones, filled in with each reader's own schemes and
//! parameter names (the adapters' URL readers and the facade's `Config`).

use proptest::prelude::*;

/// Cases per property: 1,000, or `PROPTEST_CASES`. A failure prints its minimal input; nothing
/// is written into the source tree.
pub fn proptest_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Store URLs near the valid ones: one of `schemes` (valid ones and near misses), user info
/// with stray characters, one or several hosts with ports, a path, parameters from
/// `parameters` with and without values, and a tail.
pub fn near_valid_url(
    schemes: &[&'static str],
    parameters: &[&'static str],
) -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(schemes.to_vec());
    let userinfo = prop_oneof![
        Just(String::new()),
        "[a-z]{1,5}@",
        "[a-z]{0,5}:[^@]{0,8}@",
        "[a-z]{0,3}:[a-z/#?%@:]{0,6}@",
        ".{0,6}@",
    ];
    let host = prop_oneof![
        Just("127.0.0.1".to_owned()),
        Just("[::1]".to_owned()),
        Just("[::1".to_owned()),
        Just("::1".to_owned()),
        Just("/tmp/s.sock".to_owned()),
        Just(String::new()),
        "[a-z]{1,8}",
        ".{0,6}",
    ];
    let port = prop_oneof![
        Just(String::new()),
        (0u32..70_000).prop_map(|p| format!(":{p}")),
        Just(":".to_owned()),
        Just(":99999999999999999999".to_owned()),
        ":[a-z]{1,3}",
    ];
    let hosts = prop::collection::vec((host, port), 1..4).prop_map(|hosts| {
        hosts
            .into_iter()
            .map(|(h, p)| format!("{h}{p}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    let path = prop_oneof![
        Just(String::new()),
        Just("/".to_owned()),
        "/[a-z0-9]{0,6}",
        "/-?[0-9]{1,25}",
        "/.{0,6}",
        "/[a-z]{1,4}/[0-9a-z]{0,3}(/x)?",
    ];
    let key = prop::sample::select(parameters.to_vec());
    let value = prop_oneof![
        Just(String::new()),
        Just("true".to_owned()),
        Just("resp3".to_owned()),
        Just("require".to_owned()),
        Just("18446744073709551616".to_owned()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        ".{0,6}",
    ];
    let query = prop::collection::vec((key, value, prop::bool::ANY), 0..4).prop_map(|pairs| {
        if pairs.is_empty() {
            return String::new();
        }
        let pairs: Vec<String> = pairs
            .into_iter()
            .map(|(k, v, eq)| if eq { format!("{k}={v}") } else { k.to_owned() })
            .collect();
        format!("?{}", pairs.join("&"))
    });
    (scheme, userinfo, hosts, path, query, ".{0,2}").prop_map(
        |(scheme, userinfo, hosts, path, query, tail)| {
            format!("{scheme}{userinfo}{hosts}{path}{query}{tail}")
        },
    )
}

/// A secret and the words it is made of: words of 6 to 8 letters (so none appears in an output
/// by chance) joined by the characters that confuse URL readers (`/ # @ ? :`, percent escapes,
/// a lone `%`, non-ASCII). A test that finds none of the words in an output knows the secret,
/// raw or in pieces, did not leak.
pub fn secret() -> impl Strategy<Value = (String, Vec<String>)> {
    let word = "[A-Za-z0-9éß雪ж]{6,8}";
    let sep = prop_oneof![
        Just("/"),
        Just("#"),
        Just("@"),
        Just("?"),
        Just(":"),
        Just("%2F"),
        Just("%40"),
        Just("%25"),
        Just("%"),
        Just("🔑"),
    ];
    proptest::collection::vec((sep, word), 0..4).prop_flat_map(move |rest| {
        word.prop_map(move |first| {
            let mut secret = first.clone();
            let mut words = vec![first];
            for (sep, word) in &rest {
                secret.push_str(sep);
                secret.push_str(word);
                words.push(word.clone());
            }
            (secret, words)
        })
    })
}
