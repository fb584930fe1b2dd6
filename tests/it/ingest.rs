use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde_json::{json, Value};
use swelake::ingest::run as ingest;
use swelake::lake::Lake;

use crate::common::{count, gharchive, pairs, quiet_ingest, read_lines};

/// Counts event types straight from the raw lines, with serde_json, independently of swelake.
fn independent_type_counts(lines: &[String]) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).unwrap();
        *m.entry(v["type"].as_str().unwrap().to_string()).or_default() += 1;
    }
    m
}

#[tokio::test(flavor = "multi_thread")]
async fn real_excerpts_counts_match_and_reingest_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for name in ["2015-01-01-15.json.gz", "2025-01-01-15.json.gz"] {
        std::fs::copy(gharchive(name), src.join(name)).unwrap();
    }
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();

    let s = ingest(&lake, &quiet_ingest(&src)).await.unwrap();
    assert_eq!(s.files_ingested, 2);
    assert!(s.reconciles());
    assert_eq!(s.rejected, 0, "real archive lines must all parse: {:?}", s.files);

    let mut snapshot_before = Vec::new();
    for name in ["2015-01-01-15.json.gz", "2025-01-01-15.json.gz"] {
        let lines = read_lines(&gharchive(name));
        let want = independent_type_counts(&lines);
        let got: BTreeMap<String, i64> =
            pairs(&lake, &format!("SELECT type, count(*) FROM events WHERE source_file = '{name}' GROUP BY type"))
                .await
                .into_iter()
                .collect();
        assert_eq!(got, want, "{name}");
        let file = s.files.iter().find(|f| f.source_file == name).unwrap();
        assert_eq!(file.lines_read, lines.len() as u64);

        // Typed columns agree with the raw payloads: merged PRs counted both ways.
        let merged_raw = lines
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| {
                v["type"] == "PullRequestEvent"
                    && v["payload"]["action"] == "closed"
                    && v["payload"]["pull_request"]["merged"] == true
            })
            .count() as i64;
        let merged_sql = count(
            &lake,
            &format!(
                "SELECT count(*) FROM events WHERE source_file = '{name}' AND type = 'PullRequestEvent' AND action = 'closed' AND merged"
            ),
        )
        .await;
        assert_eq!(merged_sql, merged_raw, "{name}");
        assert!(merged_raw > 10);

        // The stored payload text is exactly the line's payload (the scanner's spans).
        let want: BTreeMap<String, Value> = lines
            .iter()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| (v["id"].as_str().unwrap().to_string(), v["payload"].clone()))
            .collect();
        let batches =
            swelake::sql::query(&lake, &format!("SELECT id, payload FROM events WHERE source_file = '{name}'"))
                .await
                .unwrap();
        let mut seen = 0;
        for b in batches {
            use arrow::array::AsArray;
            let ids = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
            let pay = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Utf8).unwrap();
            for r in 0..b.num_rows() {
                let stored: Value = serde_json::from_str(pay.as_string::<i32>().value(r)).unwrap();
                assert_eq!(&stored, &want[ids.as_string::<i32>().value(r)]);
                seen += 1;
            }
        }
        assert_eq!(seen, lines.len());
        snapshot_before.push(got);
    }
    let fingerprint = "SELECT 'x', count(*) + count(DISTINCT id) + sum(source_line) FROM events";
    let before = pairs(&lake, fingerprint).await;

    // A second run skips both files; a forced run replaces them; neither duplicates a row.
    let again = ingest(&lake, &quiet_ingest(&src)).await.unwrap();
    assert_eq!((again.files_skipped, again.files_ingested), (2, 0));
    let mut forced = quiet_ingest(&src);
    forced.force = true;
    let f = ingest(&lake, &forced).await.unwrap();
    assert_eq!(f.files_ingested, 2);
    assert_eq!(pairs(&lake, fingerprint).await, before);
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, 1024 + 2048);
    assert_eq!(count(&lake, "SELECT count(DISTINCT id) FROM events").await, 1024 + 2048);

    // The tables agree with their schema files.
    for (table, parts) in [
        ("events", vec!["event_date".to_string()]),
        ("events_rejected", vec![]),
        ("source_hours", vec![]),
        ("_job_runs", vec![]),
    ] {
        let t = lake.open_table(table).await.unwrap();
        let snap = t.snapshot().unwrap();
        let schema = snap.snapshot().arrow_schema();
        let doc = swelake::schema::load(table).unwrap();
        let d = swelake::schema::diff(&doc, &schema, snap.metadata().partition_columns());
        assert!(d.is_empty(), "{table}: {d:#?}");
        assert_eq!(parts, snap.metadata().partition_columns().to_vec());
    }

    // `swelake sql --format json` prints a JSON array of row objects.
    let batches =
        swelake::sql::query(&lake, "SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY n DESC LIMIT 1")
            .await
            .unwrap();
    let mut out = Vec::new();
    swelake::sql::write(&batches, swelake::sql::Format::Json, &mut out).unwrap();
    let rows: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(rows[0]["type"], "PushEvent");
    assert_eq!(rows[0]["n"], 529 + 1463);
    // Read-only: DML and DDL are refused.
    assert!(swelake::sql::query(&lake, "DROP TABLE events").await.is_err());
    assert!(swelake::sql::query(&lake, "CREATE TABLE x AS SELECT 1").await.is_err());
}

/// Applies GitHub's 2025-10-07 trim to a real PullRequestEvent (a stub with id, number, url,
/// head and base).
fn trim_pr_event(mut v: Value) -> Value {
    let pr = &v["payload"]["pull_request"];
    let side = |s: &Value| json!({"ref": s["ref"], "sha": s["sha"], "repo": {"id": s["repo"]["id"], "url": s["repo"]["url"], "name": s["repo"]["name"]}});
    let stub = json!({"id": pr["id"], "number": pr["number"], "url": pr["url"], "head": side(&pr["head"]), "base": side(&pr["base"])});
    v["payload"] = json!({"action": "merged", "number": v["payload"]["number"], "pull_request": stub});
    v["created_at"] = json!("2025-11-01T12:00:00Z");
    v["id"] = json!("99999999999");
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn damaged_copy_reconciles_exactly() {
    let lines = read_lines(&gharchive("2025-01-01-15.json.gz"));
    let pr_line = lines.iter().find(|l| l.contains("\"type\":\"PullRequestEvent\"")).unwrap();
    let trimmed = serde_json::to_string(&trim_pr_event(serde_json::from_str(pr_line).unwrap())).unwrap();

    let mut body: Vec<Vec<u8>> = lines.iter().map(|l| l.as_bytes().to_vec()).collect();
    // Injected near the start, so they survive the truncation of the tail, in ascending order
    // so each lands at exactly the index given (line number = index + 1).
    let broken = lines[10].as_bytes()[..lines[10].len() / 2].to_vec();
    let huge = format!("{{\"id\":\"big\",\"pad\":\"{}\"}}", "a".repeat(10 << 20)).into_bytes();
    let mut bad_utf8 = lines[20].as_bytes().to_vec();
    let pos = bad_utf8.windows(7).position(|w| w == b"\"login\"").unwrap() + 10;
    bad_utf8.insert(pos, 0xff);
    let timeline = br#"{"repository":{"name":"x","owner":"y"},"actor":"bob","actor_attributes":{},"type":"PushEvent","created_at":"2012-03-10T22:34:47-08:00","payload":{},"public":true,"url":"u"}"#.to_vec();
    let injected: Vec<(usize, Vec<u8>, Option<&str>)> = vec![
        (3, broken, Some("invalid_json")),
        (5, huge, Some("line_too_long")),
        (7, bad_utf8, Some("invalid_utf8")),
        (9, timeline, Some("timeline_schema")),
        (11, trimmed.into_bytes(), None),
    ];
    for (at, line, _) in injected.iter() {
        body.insert(*at, line.clone());
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    for l in &body {
        gz.write_all(l).unwrap();
        gz.write_all(b"\n").unwrap();
    }
    let full = gz.finish().unwrap();
    let cut = &full[..full.len() * 7 / 10];

    // Independently of swelake: how many complete lines survive the cut?
    let mut decoded = Vec::new();
    let err = flate2::read::MultiGzDecoder::new(cut).read_to_end(&mut decoded).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let complete = decoded.iter().filter(|b| **b == b'\n').count();
    assert!(complete > 20 && complete < body.len());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("2025-01-01-15.json.gz");
    std::fs::write(&file, cut).unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let s = ingest(&lake, &quiet_ingest(&file)).await.unwrap();
    let f = &s.files[0];

    let mut want_reasons: BTreeMap<String, u64> = BTreeMap::new();
    for (_, _, reason) in &injected {
        if let Some(r) = reason {
            *want_reasons.entry(r.to_string()).or_default() += 1;
        }
    }
    *want_reasons.entry("truncated_gzip".into()).or_default() += 1;
    assert_eq!(f.rejected_by_reason, want_reasons);
    assert_eq!(f.lines_read, complete as u64 + 1, "complete lines plus the one the cut interrupted");
    assert_eq!(f.events_written, complete as u64 - 4);
    assert_eq!(f.lines_read, f.events_written + f.rejected);

    // The same numbers are in the tables.
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, f.events_written as i64);
    let by_reason: BTreeMap<String, u64> = pairs(&lake, "SELECT reason, count(*) FROM events_rejected GROUP BY reason")
        .await
        .into_iter()
        .map(|(k, v)| (k, v as u64))
        .collect();
    assert_eq!(by_reason, want_reasons);
    // Rejections carry their line numbers and a bounded raw text.
    let long = pairs(
        &lake,
        "SELECT CAST(line_number AS VARCHAR), raw_bytes FROM events_rejected WHERE reason = 'line_too_long'",
    )
    .await;
    assert_eq!(long, vec![("6".to_string(), huge_len())]);
    assert!(count(&lake, "SELECT max(length(raw)) FROM events_rejected").await <= 64 << 10);
    // The trimmed stub is an event, flagged, with merge state unknown rather than false.
    let stub = pairs(
        &lake,
        "SELECT CAST(payload_trimmed AS VARCHAR), CAST(merged IS NULL AS INT) FROM events WHERE id = '99999999999'",
    )
    .await;
    assert_eq!(stub, vec![("true".to_string(), 1)]);
    assert_eq!(count(&lake, "SELECT count(*) FROM events WHERE action = 'merged' AND head_sha IS NOT NULL").await, 1);
}

fn huge_len() -> i64 {
    (format!("{{\"id\":\"big\",\"pad\":\"{}\"}}", "")).len() as i64 + (10 << 20)
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupted_run_restarts_to_the_same_table() {
    let dir = tempfile::tempdir().unwrap();
    let src = gharchive("2015-01-01-15.json.gz");
    let reference = Lake::open(dir.path().join("ref").to_str().unwrap()).unwrap();
    ingest(&reference, &quiet_ingest(&src)).await.unwrap();

    // A run that died after committing events but before recording itself, and left a stray
    // half-written Parquet file behind: the restart must neither duplicate nor lose rows.
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    ingest(&lake, &quiet_ingest(&src)).await.unwrap();
    std::fs::remove_dir_all(lake.local_root().unwrap().join("_job_runs")).unwrap();
    let stray =
        lake.local_root().unwrap().join("events").join("event_date=2015-01-01").join("2015-01-01-15.deadbeef.parquet");
    std::fs::write(&stray, b"PAR1 partial").unwrap();
    let s = ingest(&lake, &quiet_ingest(&src)).await.unwrap();
    assert_eq!(s.files_ingested, 1, "not recorded as done, so it runs again");

    let q = "SELECT type, count(*) + sum(source_line) FROM events GROUP BY type ORDER BY type";
    assert_eq!(pairs(&lake, q).await, pairs(&reference, q).await);
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, 1024);
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_by_glob_and_hour_range() {
    let dir = tempfile::tempdir().unwrap();
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz"));
    for (h, chunk) in lines.chunks(100).take(3).enumerate() {
        let mut text = chunk.join("\n");
        text.push('\n');
        std::fs::write(dir.path().join(format!("2015-01-01-{}.json", h + 15)), text).unwrap();
    }
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let mut opts = quiet_ingest(&dir.path().join("2015-01-01-1*.json"));
    opts.from = swelake::ingest::source::Hour::parse("2015-01-01-16");
    opts.to = swelake::ingest::source::Hour::parse("2015-01-01-17");
    let s = ingest(&lake, &opts).await.unwrap();
    let keys: Vec<&str> = s.files.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(keys, vec!["2015-01-01-16", "2015-01-01-17"]);
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn thin_and_missing_hours_are_flagged_in_status() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hours");
    std::fs::create_dir(&src).unwrap();
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz"));
    // Eight days and one hour of 100-line hours, from 2015-01-01-0: day 8 hour 10 is cut to
    // 1% of its lines and day 8 hour 5 is missing; day 8 hour 12 is a normal hour.
    let start = chrono::NaiveDate::from_ymd_opt(2015, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap();
    for h in 0..(8 * 24 + 1) {
        let t = start + chrono::Duration::hours(h);
        let key = t.format("%Y-%m-%d-%-H").to_string();
        if key == "2015-01-08-5" {
            continue;
        }
        let n = if key == "2015-01-08-10" { 1 } else { 100 };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for l in &lines[(h as usize * 3) % 900..][..n] {
            writeln!(gz, "{l}").unwrap();
        }
        std::fs::write(src.join(format!("{key}.json.gz")), gz.finish().unwrap()).unwrap();
    }
    let lake = dir.path().join("lake").display().to_string();
    let cfg = dir.path().join("curation.toml");
    std::fs::write(&cfg, "[completeness]\nmin_weeks = 1\n").unwrap();
    let bin = env!("CARGO_BIN_EXE_swelake");
    let o = std::process::Command::new(bin)
        .args(["-q", "ingest", "--source", src.to_str().unwrap(), "--lake", &lake])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = std::process::Command::new(bin)
        .args(["status", "--lake", &lake, "--json", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hours = &status["hours"];
    let flagged: Vec<(String, String)> = hours["flagged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["hour"].as_str().unwrap().to_string(), f["reason"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        flagged,
        vec![("2015-01-08-5".to_string(), "missing".to_string()), ("2015-01-08-10".to_string(), "low".to_string())]
    );
    assert_eq!(hours["hours_ingested"], 8 * 24);
    // The first week has nothing to compare with; the rest of day 8 (hour 12 among them) is complete.
    assert_eq!(hours["no_baseline"], 7 * 24);
    assert_eq!(hours["complete"], 24 + 1 - 2);
    let t = Lake::open(&lake).unwrap();
    assert_eq!(count(&t, "SELECT count(*) FROM source_hours").await, 8 * 24);
    assert_eq!(
        count(&t, "SELECT sum(lines) FROM source_hours").await,
        count(&t, "SELECT count(*) FROM events").await + count(&t, "SELECT count(*) FROM events_rejected").await
    );
}
