use std::io::BufRead;

use arrow::array::{Array, AsArray};
use serde_json::Value;
use swelake::reward::batch::{score_stream, Case};

use crate::common::data;

fn parity_cases() -> Vec<Value> {
    let path = data().join("parity/reward_cases.jsonl.gz");
    let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::io::BufReader::new(flate2::read::MultiGzDecoder::new(f))
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

#[test]
fn all_parity_cases_match_the_reference() {
    let cases = parity_cases();
    assert_eq!(cases.len(), 1000);
    let mut failures = Vec::new();
    for c in &cases {
        let expected = c["expected"].as_f64().unwrap();
        let case: Case = serde_json::from_value(c.clone()).unwrap();
        match case.score() {
            Ok(r) if (r.reward - expected).abs() <= 1e-9 => {}
            Ok(r) => failures.push(format!("{}: got {}, expected {expected}", c["id"], r.reward)),
            Err(e) => failures.push(format!("{}: error {e}", c["id"])),
        }
    }
    assert!(failures.is_empty(), "{} of 1000 differ:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn batch_over_parity_file_is_ordered_and_complete() {
    let path = data().join("parity/reward_cases.jsonl.gz");
    let input = swelake::files::open_maybe_gz(&path).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let mut out = Vec::new();
    let s = score_stream(input, &mut out, &pool).unwrap();
    assert_eq!((s.lines, s.scored, s.errors), (1000, 1000, 0));
    let cases = parity_cases();
    for (line, case) in String::from_utf8(out).unwrap().lines().zip(&cases) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["id"], case["id"]);
        assert!((v["reward"].as_f64().unwrap() - case["expected"].as_f64().unwrap()).abs() <= 1e-9);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sql_udf_scores_json_and_map_arguments() {
    // A real Delta table of rollouts, scored in SQL.
    let dir = tempfile::tempdir().unwrap();
    let lake = swelake::lake::Lake::open(dir.path().to_str().unwrap()).unwrap();
    let cases: Vec<Value> = parity_cases().into_iter().filter(|c| c["kind"] == "search_replace").take(40).collect();
    let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Utf8, false),
        arrow::datatypes::Field::new("context", arrow::datatypes::DataType::Utf8, false),
        arrow::datatypes::Field::new("oracle", arrow::datatypes::DataType::Utf8, false),
        arrow::datatypes::Field::new("completion", arrow::datatypes::DataType::Utf8, false),
        arrow::datatypes::Field::new("expected", arrow::datatypes::DataType::Float64, false),
    ]));
    let col = |f: &dyn Fn(&Value) -> String| -> arrow::array::ArrayRef {
        std::sync::Arc::new(arrow::array::StringArray::from_iter_values(cases.iter().map(f)))
    };
    let batch = arrow::array::RecordBatch::try_new(
        schema.clone(),
        vec![
            col(&|c| c["id"].as_str().unwrap().to_string()),
            col(&|c| c["context"].to_string()),
            col(&|c| c["oracle"].to_string()),
            col(&|c| c["output"].as_str().unwrap().to_string()),
            std::sync::Arc::new(arrow::array::Float64Array::from_iter_values(
                cases.iter().map(|c| c["expected"].as_f64().unwrap()),
            )),
        ],
    )
    .unwrap();
    let table = lake.ensure_table("rollouts", &schema, &[]).await.unwrap();
    lake.append(table, vec![batch]).await.unwrap();

    let batches = swelake::sql::query(
        &lake,
        "SELECT count(*), sum(CASE WHEN abs(swerl_reward(context, oracle, completion) - expected) <= 1e-9 THEN 1 ELSE 0 END), \
         sum(CASE WHEN swerl_format_error(context, oracle, completion) IS NOT NULL THEN 1 ELSE 0 END), \
         sum(CASE WHEN expected = -1 THEN 1 ELSE 0 END) FROM rollouts",
    )
    .await
    .unwrap();
    let b = &batches[0];
    let v = |i: usize| {
        arrow::compute::cast(b.column(i), &arrow::datatypes::DataType::Int64)
            .unwrap()
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0)
    };
    assert_eq!(v(0), 40);
    assert_eq!(v(1), 40, "every row matches the reference value");
    assert_eq!(v(2), v(3), "a format error exactly where the reward is -1");
    assert!(v(3) > 0);

    // MAP arguments work too.
    let batches = swelake::sql::query(
        &lake,
        "SELECT swerl_reward(map(['a.py'], ['x = 1\n']), map(['a.py'], ['x = 2\n']), \
         '<think>t</think><solution>```\n### a.py\n<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n>>>>>>> REPLACE\n```</solution>')",
    )
    .await
    .unwrap();
    let r = batches[0].column(0).as_primitive::<arrow::datatypes::Float64Type>();
    assert!(!r.is_null(0));
    assert_eq!(r.value(0), 1.0);

    // A wrong call fails when the query is planned, naming the function and its arguments.
    for (bad, says) in [
        ("SELECT swerl_reward('{}', '{}')", "takes 3 arguments, not 2"),
        ("SELECT swerl_reward(1, '{}', 'x')", "argument 1 (context) is Int64"),
        ("SELECT swerl_format_error('{}', '{}', 7)", "argument 3 (output) is Int64"),
        ("SELECT resolving_refs(1)", "resolving_refs"),
        ("SELECT is_noise_path(1)", "is_noise_path"),
        ("SELECT is_bot_account('a')", "is_bot_account"),
    ] {
        let e = format!("{:#}", swelake::sql::query(&lake, bad).await.unwrap_err());
        assert!(e.contains(says), "{bad}: {e}");
        assert!(
            e.contains("Error during planning") || e.contains("coerce") || e.contains("No function matches"),
            "{bad}: {e}"
        );
    }
}

fn map_array(maps: &[&Value]) -> arrow::array::MapArray {
    let mut b =
        arrow::array::MapBuilder::new(None, arrow::array::StringBuilder::new(), arrow::array::StringBuilder::new());
    for m in maps {
        for (k, v) in m.as_object().unwrap() {
            b.keys().append_value(k);
            b.values().append_value(v.as_str().unwrap());
        }
        b.append(true).unwrap();
    }
    b.finish()
}

fn write_parquet(path: &std::path::Path, columns: Vec<(&str, arrow::array::ArrayRef)>) {
    let batch = arrow::array::RecordBatch::try_from_iter(columns).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn rollout_parquet_inline_and_seed_lookup() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<Value> = parity_cases().into_iter().filter(|c| c["kind"] == "search_replace").take(30).collect();
    let strs = |f: &dyn Fn(&Value) -> String| -> arrow::array::ArrayRef {
        Arc::new(arrow::array::StringArray::from_iter_values(cases.iter().map(f)))
    };
    let ctx: Vec<&Value> = cases.iter().map(|c| &c["context"]).collect();
    let ora: Vec<&Value> = cases.iter().map(|c| &c["oracle"]).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();

    // Inline maps.
    let inline = dir.path().join("inline.parquet");
    write_parquet(
        &inline,
        vec![
            ("instance_id", strs(&|c| c["id"].as_str().unwrap().to_string())),
            ("group_id", strs(&|_| "g0".to_string())),
            ("completion", strs(&|c| c["output"].as_str().unwrap().to_string())),
            ("context", Arc::new(map_array(&ctx))),
            ("oracle", Arc::new(map_array(&ora))),
        ],
    );
    let out = dir.path().join("scored.parquet");
    let s = swelake::reward::rollouts::score_rollouts(&inline, &out, None, &pool).unwrap();
    assert_eq!((s.rows, s.scored, s.unscoreable), (30, 30, 0));
    let read = |p: &std::path::Path| -> arrow::array::RecordBatch {
        let f = std::fs::File::open(p).unwrap();
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap().build().unwrap();
        let batches: Vec<_> = r.map(|b| b.unwrap()).collect();
        arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
    };
    let b = read(&out);
    let doc = swelake::schema::load("rollouts").unwrap();
    assert!(
        swelake::schema::diff_open(&doc, &b.schema()).is_empty(),
        "{:?}",
        swelake::schema::diff_open(&doc, &b.schema())
    );
    let rewards = b.column_by_name("reward").unwrap().as_primitive::<arrow::datatypes::Float64Type>();
    let fe = b.column_by_name("format_error").unwrap().as_string::<i32>();
    for (i, c) in cases.iter().enumerate() {
        let e = c["expected"].as_f64().unwrap();
        assert!((rewards.value(i) - e).abs() <= 1e-9, "{}", c["id"]);
        assert_eq!(fe.is_null(i), e != -1.0, "{}", c["id"]);
    }

    // No inline maps: looked up from a seed shard; one rollout names an unknown instance.
    let shard = dir.path().join("part-00000.parquet");
    write_parquet(
        &shard,
        vec![
            ("instance_id", strs(&|c| c["id"].as_str().unwrap().to_string())),
            ("context", Arc::new(map_array(&ctx))),
            ("oracle", Arc::new(map_array(&ora))),
        ],
    );
    let bare = dir.path().join("bare.parquet");
    write_parquet(
        &bare,
        vec![
            (
                "instance_id",
                strs(&|c| if c == &cases[0] { "nope#1".to_string() } else { c["id"].as_str().unwrap().to_string() }),
            ),
            ("group_id", strs(&|_| "g1".to_string())),
            ("completion", strs(&|c| c["output"].as_str().unwrap().to_string())),
        ],
    );
    let glob = dir.path().join("part-*.parquet");
    let seed = swelake::train::data::seed_lookup(glob.to_str().unwrap()).unwrap();
    assert!(swelake::reward::rollouts::score_rollouts(&bare, &out, None, &pool).is_err(), "needs the seed shards");
    let s = swelake::reward::rollouts::score_rollouts(&bare, &out, Some(&seed), &pool).unwrap();
    assert_eq!((s.rows, s.scored, s.unscoreable), (30, 29, 1));
    let b = read(&out);
    let err = b.column_by_name("reward_error").unwrap().as_string::<i32>();
    assert!(err.value(0).contains("nope#1"));
    assert!(b.column_by_name("reward").unwrap().is_null(0));
}
