//! The table contracts in `schemas/*.toml`: columns with types, nullability and a sentence
//! each, keys and partitioning. They are compiled in, and they are the only definition of a
//! table's layout: every table's Arrow schema is built from its file ([`arrow()`]), and a test
//! checks every written table against it, so documentation and data cannot drift apart.
//!
//! Types are Delta's names: `string`, `binary`, `boolean`, `integer`, `long`, `float`,
//! `double`, `date`, `timestamp` (microseconds, UTC), and nested `array<T>`, `map<K,V>` and
//! `struct<name:T,...>`. Inside nested types, list items and map values are nullable, map keys
//! and struct fields are not.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use anyhow::{bail, Context, Result};
use arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
pub struct ColumnDoc {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub nullable: bool,
    pub description: String,
    /// For files read from outside (rollouts): the column may be absent.
    #[serde(default)]
    pub optional: bool,
    /// Long text that repeats across rows (a PR's title and body on each of its events):
    /// the jobs that write the table keep it dictionary-encoded, up to 8 MB per row group.
    #[serde(default)]
    pub repeats: bool,
}

/// The columns of `table`'s schema file marked `repeats = true` (none for a table without one).
pub fn repeated_columns(table: &str) -> Vec<String> {
    load(table).map(|d| d.columns.into_iter().filter(|c| c.repeats).map(|c| c.name).collect()).unwrap_or_default()
}

/// Every schema file, by table name.
pub const FILES: &[(&str, &str)] = &[
    ("events", include_str!("../schemas/events.toml")),
    ("events_rejected", include_str!("../schemas/events_rejected.toml")),
    ("source_hours", include_str!("../schemas/source_hours.toml")),
    ("_job_runs", include_str!("../schemas/_job_runs.toml")),
    ("rollouts", include_str!("../schemas/rollouts.toml")),
    ("pr_timeline", include_str!("../schemas/pr_timeline.toml")),
    ("pull_requests", include_str!("../schemas/pull_requests.toml")),
    ("pr_git_facts", include_str!("../schemas/pr_git_facts.toml")),
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
    ("relevance_models", include_str!("../schemas/relevance_models.toml")),
    ("environments", include_str!("../schemas/environments.toml")),
    ("pr_tests", include_str!("../schemas/pr_tests.toml")),
    ("pr_verification", include_str!("../schemas/pr_verification.toml")),
    ("rl_seed", include_str!("../schemas/rl_seed.toml")),
    ("seed_shards", include_str!("../schemas/seed_shards.toml")),
    ("seed_rejections", include_str!("../schemas/seed_rejections.toml")),
    ("github_api_repos", include_str!("../schemas/github_api_repos.toml")),
];

/// A parsed schema file with its Arrow schema, or why it does not build.
type Contract = Result<(TableDoc, SchemaRef), String>;

/// The parsed files and their Arrow schemas, built once.
static CONTRACTS: LazyLock<BTreeMap<&'static str, Contract>> = LazyLock::new(|| {
    FILES
        .iter()
        .map(|(name, text)| {
            let parsed = toml::from_str::<TableDoc>(text)
                .map_err(|e| format!("parsing schemas/{name}.toml: {e}"))
                .and_then(|doc| build(&doc).map(|s| (doc, s)).map_err(|e| format!("schemas/{name}.toml: {e:#}")));
            (*name, parsed)
        })
        .collect()
});

fn contract(table: &str) -> Result<&'static (TableDoc, SchemaRef)> {
    match CONTRACTS.get(table) {
        Some(Ok(c)) => Ok(c),
        Some(Err(e)) => bail!("{e}"),
        None => bail!("no schema file for table `{table}`"),
    }
}

/// The schema file of `table`.
pub fn load(table: &str) -> Result<TableDoc> {
    Ok(contract(table)?.0.clone())
}

/// The Arrow schema of `table` (partition columns included), as its schema file describes it.
pub fn arrow(table: &str) -> Result<SchemaRef> {
    Ok(contract(table)?.1.clone())
}

/// [`arrow()`] for a table whose schema file is compiled in (a test checks that every file
/// builds, so this cannot fail for the names the stages use).
pub fn builtin(table: &str) -> SchemaRef {
    arrow(table).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The partition columns of `table`.
pub fn partition_by(table: &str) -> Result<Vec<String>> {
    Ok(contract(table)?.0.partition_by.clone())
}

fn build(doc: &TableDoc) -> Result<SchemaRef> {
    let fields = doc
        .columns
        .iter()
        .map(|c| {
            Ok(Field::new(&c.name, arrow_type(&c.ty).with_context(|| format!("column `{}`", c.name))?, c.nullable))
        })
        .collect::<Result<Vec<_>>>()?;
    for k in &doc.primary_key {
        match doc.columns.iter().find(|c| &c.name == k) {
            None => bail!("key column `{k}` is not a column"),
            Some(c) if c.nullable => bail!("key column `{k}` is nullable"),
            Some(_) => {}
        }
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// The Arrow type of a schema-file type name.
pub fn arrow_type(name: &str) -> Result<DataType> {
    let mut p = TypeParser { s: name.as_bytes(), at: 0 };
    let t = p.ty()?;
    if p.at != p.s.len() {
        bail!("unexpected {:?} after the type in `{name}`", &name[p.at..]);
    }
    Ok(t)
}

/// Recursive descent over `array<T>`, `map<K,V>`, `struct<a:T,b:U>` and the scalar names.
struct TypeParser<'a> {
    s: &'a [u8],
    at: usize,
}

impl TypeParser<'_> {
    fn word(&mut self) -> String {
        let start = self.at;
        while self.at < self.s.len() && (self.s[self.at].is_ascii_alphanumeric() || self.s[self.at] == b'_') {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).into_owned()
    }

    fn expect(&mut self, c: u8) -> Result<()> {
        while self.at < self.s.len() && self.s[self.at] == b' ' {
            self.at += 1;
        }
        if self.s.get(self.at) != Some(&c) {
            bail!("expected `{}` at position {} of the type", c as char, self.at);
        }
        self.at += 1;
        while self.at < self.s.len() && self.s[self.at] == b' ' {
            self.at += 1;
        }
        Ok(())
    }

    fn peek(&self, c: u8) -> bool {
        self.s.get(self.at) == Some(&c)
    }

    fn ty(&mut self) -> Result<DataType> {
        let w = self.word();
        Ok(match w.as_str() {
            "string" => DataType::Utf8,
            "binary" => DataType::Binary,
            "boolean" => DataType::Boolean,
            "integer" => DataType::Int32,
            "long" => DataType::Int64,
            "float" => DataType::Float32,
            "double" => DataType::Float64,
            "date" => DataType::Date32,
            "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            "array" => {
                self.expect(b'<')?;
                let item = self.ty()?;
                self.expect(b'>')?;
                DataType::List(Arc::new(Field::new("item", item, true)))
            }
            "map" => {
                self.expect(b'<')?;
                let k = self.ty()?;
                self.expect(b',')?;
                let v = self.ty()?;
                self.expect(b'>')?;
                let entries = Fields::from(vec![Field::new("keys", k, false), Field::new("values", v, true)]);
                DataType::Map(Arc::new(Field::new("entries", DataType::Struct(entries), false)), false)
            }
            "struct" => {
                self.expect(b'<')?;
                let mut fields = Vec::new();
                loop {
                    let name = self.word();
                    if name.is_empty() {
                        bail!("a struct field without a name at position {}", self.at);
                    }
                    self.expect(b':')?;
                    fields.push(Field::new(name, self.ty()?, false));
                    if self.peek(b',') {
                        self.expect(b',')?;
                    } else {
                        break;
                    }
                }
                self.expect(b'>')?;
                DataType::Struct(Fields::from(fields))
            }
            "" => bail!("a type name was expected at position {}", self.at),
            other => bail!("no Arrow type for schema type `{other}`"),
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_builds_with_non_nullable_keys() {
        for (name, _) in FILES {
            let (doc, schema) = contract(name).unwrap();
            assert_eq!(doc.table, *name);
            assert!(
                diff(doc, schema, &doc.partition_by).is_empty(),
                "{name}: {:?}",
                diff(doc, schema, &doc.partition_by)
            );
            for k in &doc.primary_key {
                assert!(!schema.field_with_name(k).unwrap().is_nullable(), "{name}.{k}");
            }
        }
    }

    #[test]
    fn nested_types_round_trip_through_their_names() {
        for ty in [
            "array<string>",
            "map<string,string>",
            "array<struct<role:string,content:string>>",
            "struct<a:long,b:array<long>,c:map<string,double>>",
        ] {
            assert_eq!(type_name(&arrow_type(ty).unwrap()), ty);
        }
        assert!(arrow_type("array<strin>").unwrap_err().to_string().contains("`strin`"));
        assert!(arrow_type("map<string>").is_err());
        assert!(arrow_type("struct<a:long>x").is_err());
    }

    #[test]
    fn nested_layout_is_what_arrow_builders_make() {
        use arrow::array::{Array, ListBuilder, MapBuilder, StringBuilder, StructBuilder};
        let mut m = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        m.append(true).unwrap();
        assert_eq!(m.finish().data_type(), &arrow_type("map<string,string>").unwrap());
        let fields = match arrow_type("struct<role:string,content:string>").unwrap() {
            DataType::Struct(f) => f,
            _ => unreachable!(),
        };
        let mut l = ListBuilder::new(StructBuilder::from_fields(fields.clone(), 0)).with_field(Arc::new(Field::new(
            "item",
            DataType::Struct(fields),
            true,
        )));
        l.append(true);
        assert_eq!(l.finish().data_type(), &arrow_type("array<struct<role:string,content:string>>").unwrap());
    }
}
