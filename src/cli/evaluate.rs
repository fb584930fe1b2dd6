//! `swelake evaluate`: SWE-bench predictions graded on the lake's verified instances.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::args::{ConfigArg, LakeArg, OutputArg, RepoArgs};
use super::parse_duration;

#[derive(Args, Debug)]
#[command(after_help = "\
Each prediction ({\"instance_id\", \"model_name_or_path\", \"model_patch\"}, JSON lines or one JSON
list: SWE-bench's format; instance ids as SWE-bench writes them, owner__name-N, or owner/name#N)
is applied to its instance's merge base inside the sandbox (git apply, else patch --fuzz=5), the
PR's test files are put as the PR left them, and the PR's test files run in the environment
the verify stage built. Resolved: every FAIL_TO_PASS and PASS_TO_PASS test passes.

The report (--out) has SWE-bench's shape: resolved_ids, unresolved_ids, error_ids (the patch
does not apply, the instance is not verified in this lake), empty_patch_ids, and their counts,
plus a reason per instance; logs/<instance_id>/ beside it holds the patch, the test output and
the per-test outcomes.

Examples:
  swelake evaluate --lake lake --predictions preds.jsonl --repo-url 'file:///srv/mirrors/{repo}.git' --out eval/report.json
  jq .resolved_ids eval/report.json")]
pub(crate) struct EvaluateArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// The predictions: JSON lines (or a JSON list) of {instance_id, model_name_or_path, model_patch}.
    #[arg(long, value_name = "FILE")]
    predictions: PathBuf,
    #[command(flatten)]
    repo: RepoArgs,
    /// The report (JSON); per-instance logs go to logs/ beside it.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Time limit of one instance's test run (30s, 5m) [default: [verify] timeout_secs].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    timeout: Option<std::time::Duration>,
    /// bwrap (bubblewrap) or none (no sandbox: the patches and tests run with your rights).
    #[arg(long, value_name = "bwrap|none")]
    sandbox: Option<String>,
    #[command(flatten)]
    config: ConfigArg,
    #[command(flatten)]
    output: OutputArg,
}

impl EvaluateArgs {
    pub(crate) async fn run(self, ctx: &super::Ctx) -> Result<ExitCode> {
        let lake = self.lake.open(ctx)?;
        let mut cfg = self.config.load()?.verify;
        if let Some(t) = self.timeout {
            cfg.timeout_secs = t.as_secs().max(1);
        }
        if let Some(s) = self.sandbox {
            cfg.sandbox = s;
        }
        let mirrors = crate::git::Mirrors::new(self.repo.required_url()?, self.repo.cache_dir());
        if let Some(dir) = self.out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // The logs beside the report hold each run's patch, which `patch` reads from inside
        // the run's tree: a relative --out would name it from the wrong directory.
        let out = std::path::absolute(&self.out)?;
        let opts = crate::verify::evaluate::EvaluateOptions {
            predictions: self.predictions,
            out,
            mirrors,
            cfg,
            show_progress: !ctx.quiet && !self.output.json,
        };
        let r = crate::verify::evaluate::evaluate(&lake, &opts).await?;
        if self.output.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{} submitted: {} resolved, {} unresolved, {} empty patches, {} errors (of {} verified instances); report in {}",
                r.submitted_instances,
                r.resolved_instances,
                r.unresolved_instances,
                r.empty_patch_instances,
                r.error_instances,
                r.total_instances,
                self.out.display()
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
