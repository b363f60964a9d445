#![allow(clippy::unwrap_used, clippy::expect_used)]
//! scratch: interleaved p50/p99 of decide_json() for several policy dirs; argv[1] = input json, rest = dirs
use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let input: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&args[1]).unwrap()).unwrap();
    let engines: Vec<_> = args[2..].iter().map(|d| policy_engine::PolicyEngine::load(std::path::Path::new(d)).unwrap()).collect();
    let mut samples: Vec<Vec<f64>> = engines.iter().map(|_| vec![]).collect();
    for e in &engines { let d = e.decide_json(&input); assert!(d.allow, "{d:?}"); for _ in 0..1000 { std::hint::black_box(e.decide_json(&input)); } }
    for _ in 0..20 { for (e, s) in engines.iter().zip(samples.iter_mut()) { for _ in 0..400 {
        let t = Instant::now(); std::hint::black_box(e.decide_json(std::hint::black_box(&input))); s.push(t.elapsed().as_secs_f64()*1e6); } } }
    for (d, s) in args[2..].iter().zip(samples.iter_mut()) { s.sort_by(f64::total_cmp); println!("{d:>10}: p50 {:6.1} p90 {:6.1} p99 {:6.1}", s[s.len()/2], s[s.len()*9/10], s[s.len()*99/100]); }
}
