//! The schema-driven writer (`lake::rows::to_batch`) on every table of `schemas/`: one row
//! with a value in every column, written into a real Delta table and read back through
//! DataFusion, equal to what was written.

use serde_json::{json, Value};
use swelake::lake::Lake;

/// A value of type `t` for column `name` (nested types get one element or entry).
fn sample(name: &str, t: &arrow::datatypes::DataType) -> Value {
    use arrow::datatypes::DataType::*;
    match t {
        Utf8 | LargeUtf8 | Utf8View => json!(format!("{name}-ü\n\"q\"")),
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => json!(7),
        Float32 => json!(0.25),
        Float64 => json!(1.0 / 3.0),
        Boolean => json!(true),
        Timestamp(..) => json!(1_700_000_000_123_456i64),
        Date32 => json!(19_000),
        Binary | LargeBinary => json!("00ff7f"),
        List(item) | LargeList(item) => json!([sample(name, item.data_type())]),
        Struct(fields) => {
            Value::Object(fields.iter().map(|f| (f.name().clone(), sample(f.name(), f.data_type()))).collect())
        }
        Map(entries, _) => {
            let Struct(kv) = entries.data_type() else { panic!("{name}: a map of {entries}") };
            json!({ "k": sample(name, kv[1].data_type()) })
        }
        other => panic!("{name}: no sample for {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_row_of_every_table_is_written_by_name_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    for (table, _) in swelake::schema::FILES {
        let schema = swelake::schema::arrow(table).unwrap();
        let row: serde_json::Map<String, Value> =
            schema.fields().iter().map(|f| (f.name().clone(), sample(f.name(), f.data_type()))).collect();
        let written = swelake::lake::rows::to_batch(table, &[Value::Object(row.clone())])
            .unwrap_or_else(|e| panic!("{table}: {e:#}"));
        assert_eq!(written.num_rows(), 1);
        let t = lake.ensure_contract_table(table).await.unwrap();
        lake.append(t, vec![written.clone()]).await.unwrap();

        let ctx = lake.session().await.unwrap();
        let cols: Vec<String> = schema.fields().iter().map(|f| format!("\"{}\"", f.name())).collect();
        let read = ctx.sql(&format!("SELECT {} FROM {table}", cols.join(", "))).await.unwrap().collect().await.unwrap();
        let show = |b: &[arrow::array::RecordBatch]| arrow::util::pretty::pretty_format_batches(b).unwrap().to_string();
        assert_eq!(show(&read), show(std::slice::from_ref(&written)), "{table}");

        // A field the table does not have, and a column left unfilled, are named.
        let mut extra = row.clone();
        extra.insert("no_such_column".into(), json!(1));
        let e = swelake::lake::rows::to_batch(table, &[Value::Object(extra)]).unwrap_err().to_string();
        assert!(e.contains("no_such_column"), "{table}: {e}");
        let mut short = row;
        let gone = schema.field(0).name().clone();
        short.remove(&gone);
        let e = swelake::lake::rows::to_batch(table, &[Value::Object(short)]).unwrap_err().to_string();
        assert!(e.contains(&format!("\"{gone}\"")), "{table}: {e}");
    }
}
