//! The table contracts in `schemas/*.toml`: columns with types, nullability and a sentence
//! each, keys and partitioning. They are compiled in, printed by `swelake schema`, and a test
//! checks every written table against its file, so documentation and data cannot drift apart.

use anyhow::{bail, Context, Result};
use arrow::datatypes::{DataType, Schema};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct TableDoc {
    pub table: String,
    pub description: String,
    #[serde(default)]
    pub primary_key: Vec<String>,
    #[serde(default)]
    pub partition_by: Vec<String>,
    pub columns: Vec<ColumnDoc>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ColumnDoc {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub nullable: bool,
    pub description: String,
    /// For files read from outside (rollouts): the column may be absent.
    #[serde(default)]
    pub optional: bool,
}

/// Every schema file, by table name.
pub const FILES: &[(&str, &str)] = &[
    ("events", include_str!("../schemas/events.toml")),
    ("events_rejected", include_str!("../schemas/events_rejected.toml")),
    ("_job_runs", include_str!("../schemas/_job_runs.toml")),
    ("rollouts", include_str!("../schemas/rollouts.toml")),
    ("pr_timeline", include_str!("../schemas/pr_timeline.toml")),
    ("pull_requests", include_str!("../schemas/pull_requests.toml")),
    ("issues", include_str!("../schemas/issues.toml")),
    ("pr_issue_links", include_str!("../schemas/pr_issue_links.toml")),
    ("pr_files", include_str!("../schemas/pr_files.toml")),
    ("file_blobs", include_str!("../schemas/file_blobs.toml")),
    ("pr_commits", include_str!("../schemas/pr_commits.toml")),
    ("pr_snapshots", include_str!("../schemas/pr_snapshots.toml")),
    ("snapshot_errors", include_str!("../schemas/snapshot_errors.toml")),
    ("pr_quality", include_str!("../schemas/pr_quality.toml")),
    ("pr_relevant_files", include_str!("../schemas/pr_relevant_files.toml")),
    ("blob_embeddings", include_str!("../schemas/blob_embeddings.toml")),
    ("rl_seed", include_str!("../schemas/rl_seed.toml")),
    ("seed_rejections", include_str!("../schemas/seed_rejections.toml")),
];

pub fn load(table: &str) -> Result<TableDoc> {
    let Some((_, text)) = FILES.iter().find(|(n, _)| *n == table) else {
        bail!("no schema file for table `{table}`");
    };
    let doc: TableDoc = toml::from_str(text).with_context(|| format!("parsing schemas/{table}.toml"))?;
    Ok(doc)
}

/// The Arrow schema of a table swelake writes with a fixed layout (not the SQL-job outputs,
/// whose layout is their query's).
pub fn builtin_arrow_schema(table: &str) -> Option<arrow::datatypes::SchemaRef> {
    use crate::snapshots::tables as t;
    Some(match table {
        "events" => crate::ingest::batch::EVENTS_SCHEMA.clone(),
        "events_rejected" => crate::ingest::batch::REJECTED_SCHEMA.clone(),
        "_job_runs" => crate::jobs::runs::JOB_RUNS_SCHEMA.clone(),
        "pr_files" => t::PR_FILES.clone(),
        "file_blobs" => t::FILE_BLOBS.clone(),
        "pr_commits" => t::PR_COMMITS.clone(),
        "pr_snapshots" => t::PR_SNAPSHOTS.clone(),
        "snapshot_errors" => t::SNAPSHOT_ERRORS.clone(),
        other => return load(other).ok().and_then(|doc| arrow_schema(&doc).ok()),
    })
}

/// The Arrow type of a schema-file type name.
fn arrow_type(name: &str) -> anyhow::Result<DataType> {
    use arrow::datatypes::{Field, TimeUnit};
    Ok(match name {
        "string" => DataType::Utf8,
        "binary" => DataType::Binary,
        "boolean" => DataType::Boolean,
        "integer" => DataType::Int32,
        "long" => DataType::Int64,
        "float" => DataType::Float32,
        "double" => DataType::Float64,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        other => match other.strip_prefix("array<").and_then(|r| r.strip_suffix('>')) {
            Some(inner) => DataType::List(std::sync::Arc::new(Field::new("item", arrow_type(inner)?, true))),
            None => bail!("no Arrow type for schema type `{other}`"),
        },
    })
}

/// The Arrow schema a schema file describes.
pub fn arrow_schema(doc: &TableDoc) -> anyhow::Result<arrow::datatypes::SchemaRef> {
    let fields = doc
        .columns
        .iter()
        .map(|c| Ok(arrow::datatypes::Field::new(&c.name, arrow_type(&c.ty)?, c.nullable)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(std::sync::Arc::new(Schema::new(fields)))
}

/// The type names used in schema files (Delta's vocabulary).
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".into(),
        DataType::Boolean => "boolean".into(),
        DataType::Int8 => "byte".into(),
        DataType::Int16 => "short".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "long".into(),
        DataType::Float32 => "float".into(),
        DataType::Float64 => "double".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp".into(),
        DataType::Timestamp(_, None) => "timestamp_ntz".into(),
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
            format!("array<{}>", type_name(f.data_type()))
        }
        DataType::Map(f, _) => match f.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                format!("map<{},{}>", type_name(kv[0].data_type()), type_name(kv[1].data_type()))
            }
            other => format!("map<{other}>"),
        },
        DataType::Struct(fields) => {
            let inner: Vec<String> =
                fields.iter().map(|f| format!("{}:{}", f.name(), type_name(f.data_type()))).collect();
            format!("struct<{}>", inner.join(","))
        }
        other => other.to_string(),
    }
}

/// Differences between a schema file and an actual table schema (empty = they agree).
pub fn diff(doc: &TableDoc, actual: &Schema, actual_partitions: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let want: Vec<&str> = doc.columns.iter().map(|c| c.name.as_str()).collect();
    let have: Vec<&str> = actual.fields().iter().map(|f| f.name().as_str()).collect();
    if want != have {
        out.push(format!("columns differ: file {want:?}, table {have:?}"));
    }
    for c in &doc.columns {
        match actual.field_with_name(&c.name) {
            Ok(f) => {
                let t = type_name(f.data_type());
                if t != c.ty {
                    out.push(format!("{}: file says {}, table has {t}", c.name, c.ty));
                }
                if f.is_nullable() != c.nullable {
                    out.push(format!(
                        "{}: file says nullable={}, table has nullable={}",
                        c.name,
                        c.nullable,
                        f.is_nullable()
                    ));
                }
            }
            Err(_) => out.push(format!("{}: missing from the table", c.name)),
        }
        if c.description.trim().is_empty() {
            out.push(format!("{}: no description", c.name));
        }
    }
    if doc.partition_by != actual_partitions {
        out.push(format!("partitioning differs: file {:?}, table {actual_partitions:?}", doc.partition_by));
    }
    out
}

/// Differences for a file that may carry extra or optional columns in any order (rollouts):
/// every non-optional column must be present, and every present documented column must have
/// the documented type.
pub fn diff_open(doc: &TableDoc, actual: &Schema) -> Vec<String> {
    let mut out = Vec::new();
    for c in &doc.columns {
        match actual.field_with_name(&c.name) {
            Ok(f) => {
                let t = type_name(f.data_type());
                if t != c.ty {
                    out.push(format!("{}: file says {}, data has {t}", c.name, c.ty));
                }
            }
            Err(_) if c.optional => {}
            Err(_) => out.push(format!("{}: required but missing", c.name)),
        }
    }
    out
}

/// Markdown rendering of a schema file, for `swelake schema`.
pub fn render(doc: &TableDoc) -> String {
    let mut s = format!("## {}\n\n{}\n\n", doc.table, doc.description.trim());
    if !doc.primary_key.is_empty() {
        s.push_str(&format!("Key: {}. ", doc.primary_key.join(", ")));
    }
    if !doc.partition_by.is_empty() {
        s.push_str(&format!("Partitioned by: {}.", doc.partition_by.join(", ")));
    }
    s.push_str("\n\n| column | type | null | meaning |\n|---|---|---|---|\n");
    for c in &doc.columns {
        s.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            c.name,
            c.ty,
            if c.nullable { "yes" } else { "no" },
            c.description.trim()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_files_match_the_code() {
        let seed = crate::seed::seed_schema();
        let cases: Vec<(&str, &Schema, Vec<String>)> = vec![
            ("events", &crate::ingest::batch::EVENTS_SCHEMA, vec!["event_date".into()]),
            ("events_rejected", &crate::ingest::batch::REJECTED_SCHEMA, vec![]),
            ("_job_runs", &crate::jobs::runs::JOB_RUNS_SCHEMA, vec![]),
            ("pr_files", &crate::snapshots::tables::PR_FILES, vec![]),
            ("file_blobs", &crate::snapshots::tables::FILE_BLOBS, vec![]),
            ("pr_commits", &crate::snapshots::tables::PR_COMMITS, vec![]),
            ("pr_snapshots", &crate::snapshots::tables::PR_SNAPSHOTS, vec![]),
            ("snapshot_errors", &crate::snapshots::tables::SNAPSHOT_ERRORS, vec![]),
            ("rl_seed", &seed, vec![]),
        ];
        for (name, schema, parts) in cases {
            let doc = load(name).unwrap();
            assert_eq!(doc.table, name);
            let d = diff(&doc, schema, &parts);
            assert!(d.is_empty(), "{name}: {d:#?}");
        }
    }
}
