//! `swelake export`: the seed dataset in the layouts of Hugging Face and SWE-bench.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::args::{ConfigArg, LakeArg, OutputArg};
use crate::export::{ExportFormat, ExportOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// A Hugging Face dataset: data/{train,test}-NNNNN-of-MMMMM.parquet and README.md (the card,
    /// with the YAML front matter the Hub reads).
    Hf,
    /// SWE-bench task instances: {train,test}.jsonl and README.md.
    Swebench,
}

#[derive(Args, Debug)]
#[command(after_help = "\
The hf layout opens with `datasets.load_dataset(DIR)` (train and test splits) and uploads to the
Hub as it is (`huggingface-cli upload ORG/NAME DIR --repo-type dataset`); its columns are those of
the seed shards (schemas/seed_shards.toml). The swebench layout loads with
`swebench.harness.utils.load_swebench_dataset(\"DIR/test.jsonl\")`; FAIL_TO_PASS and PASS_TO_PASS
come from `swelake run verify` (empty for instances it did not verify; --verified-only leaves
those out), and `swelake evaluate` grades predictions on them (DIR/README.md says what each
field holds).

Examples:
  swelake export --lake lake --format hf --out exports/seed-hf
  swelake export --lake lake --format swebench --out exports/seed-swebench
  swelake export --lake lake --format swebench --verified-only --out exports/seed-verified
  swelake export --lake s3://bucket/lake --format hf --out s3://bucket/datasets/seed")]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// The layout to write.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Destination: a directory (created if needed) or a store URL.
    #[arg(long)]
    out: String,
    /// Rows per Parquet file of the hf layout.
    #[arg(long, default_value_t = 10_000)]
    rows_per_file: usize,
    /// Only the instances the verify stage verified (tests that fail before and pass after).
    #[arg(long)]
    verified_only: bool,
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    output: OutputArg,
}

impl ExportArgs {
    pub(crate) async fn run(self, ctx: &super::Ctx) -> Result<ExitCode> {
        let lake = self.lake.open(ctx)?;
        let completeness = self.config.load()?.completeness;
        let opts = ExportOptions {
            format: match self.format {
                FormatArg::Hf => ExportFormat::Hf,
                FormatArg::Swebench => ExportFormat::Swebench,
            },
            out: self.out,
            storage_options: ctx.given.clone(),
            rows_per_file: self.rows_per_file,
            completeness,
            verified_only: self.verified_only,
        };
        let s = crate::export::run(&lake, &opts).await?;
        if self.output.json {
            println!("{}", serde_json::to_string(&s)?);
        } else {
            let rows: Vec<String> = s.rows.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("exported {} to {} ({} files)", rows.join(", "), s.out, s.files.len());
            if s.only_tests > 0 {
                println!("left out {} instances that change only test files", s.only_tests);
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
