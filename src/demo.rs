//! `swelake demo`: every stage that exists, on the bundled samples, offline, into a fresh
//! local lake, ending with a summary of what was built and queries to try next.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::ingest::IngestOptions;
use crate::lake::Lake;

/// Marks a directory as created by the demo, so a rerun may replace it without risk of
/// deleting someone's real lake.
const MARKER: &str = ".swelake-demo";

fn prepare_lake_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty = std::fs::read_dir(dir)?.next().is_none();
        if !empty && !dir.join(MARKER).exists() {
            bail!("{} exists and was not made by `swelake demo`; pass another --lake", dir.display());
        }
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(MARKER), "created by swelake demo; safe to delete\n")?;
    Ok(())
}

/// (label, count) rows of a query; a NULL label reads as "NULL".
async fn counts(lake: &Lake, sql: &str) -> Result<Vec<(String, i64)>> {
    let batches = crate::sql::query(lake, sql).await?;
    let rows: Vec<(Option<String>, i64)> = crate::query::from_batches(&batches)?;
    Ok(rows.into_iter().map(|(k, n)| (k.unwrap_or_else(|| "NULL".into()), n)).collect())
}

/// Runs the demo and returns the report to print.
pub async fn run(samples: &Path, lake_dir: &Path, progress: bool) -> Result<String> {
    let hours = samples.join("gharchive");
    if !hours.is_dir() {
        bail!("{} not found: run the demo from the repository root or pass --samples", hours.display());
    }
    prepare_lake_dir(lake_dir)?;
    let lake = Lake::open(&lake_dir.to_string_lossy())?;
    let root = lake.local_root().expect("the demo's lake is a directory").to_path_buf();
    let mut report = String::new();
    writeln!(report, "swelake demo — lake at {}", root.display())?;

    // Stage 1: ingest.
    let opts =
        IngestOptions { source: hours.to_string_lossy().into_owned(), show_progress: progress, ..Default::default() };
    let s = crate::ingest::run(&lake, &opts).await?;
    writeln!(
        report,
        "\n[ingest] {} hour file(s): {} lines = {} events + {} rejected{}",
        s.files_ingested,
        s.lines_read,
        s.events_written,
        s.rejected,
        if s.reconciles() { " (reconciled)" } else { " (DOES NOT RECONCILE)" }
    )?;
    for (t, n) in counts(&lake, "SELECT type, count(*) FROM events GROUP BY type ORDER BY count(*) DESC, type").await? {
        writeln!(report, "  {t:<32} {n:>6}")?;
    }
    let reasons = counts(&lake, "SELECT reason, count(*) FROM events_rejected GROUP BY reason ORDER BY reason").await?;
    if !reasons.is_empty() {
        writeln!(report, "  rejected lines by reason:")?;
        for (r, n) in reasons {
            writeln!(report, "    {r:<30} {n:>6}")?;
        }
    }

    // Stages 2 and 3: pull-request tables (the SQL jobs of jobs/*.toml) and file snapshots
    // from the sample repositories, which are made by code (see `samples`).
    let repos_dir = root.join("_sample_repos");
    let repos = crate::samples::create_repos(&repos_dir)?;
    let mirrors = crate::git::Mirrors::new(format!("{}/{{repo}}.git", repos_dir.display()), root.join("_mirrors"));
    let registry = crate::jobs::Registry::load(None, None)?;
    let all: Vec<String> = registry.jobs.keys().cloned().collect();
    let opts = crate::jobs::RunOptions {
        all: true,
        git: Some(crate::jobs::GitOptions::new(mirrors)),
        show_progress: progress,
        ..Default::default()
    };
    let summaries = crate::jobs::run(&lake, &registry, &all, &opts).await?;
    writeln!(report, "\n[repositories] {} sample git repositories in {}", repos.len(), repos_dir.display())?;
    writeln!(report, "\n[jobs]")?;
    for s in summaries.iter().filter(|s| s.job != "ingest") {
        for line in s.render().lines() {
            writeln!(report, "  {line}")?;
        }
    }
    let prs = crate::sql::query(
        &lake,
        "SELECT p.repo_name, p.number, coalesce(p.title, '(title unknown)') AS title, \
         CASE WHEN p.merged THEN 'merged' WHEN p.merged IS NULL THEN 'merge state unknown' ELSE 'not merged' END AS merge, \
         p.metadata_source, l.issue_number \
         FROM pull_requests p LEFT JOIN pr_issue_links l ON l.repo_name = p.repo_name AND l.pr_number = p.number \
         ORDER BY p.repo_name, p.number",
    )
    .await?;
    writeln!(report, "  pull requests:")?;
    for line in arrow::util::pretty::pretty_format_batches(&prs)?.to_string().lines() {
        writeln!(report, "    {line}")?;
    }

    if lake.has_table("rl_seed").await? {
        let card = crate::report::run(
            &lake,
            &crate::report::ReportOptions { out: root.join("card"), completeness: Default::default() },
        )
        .await?;
        writeln!(report, "  seed shards: {}", root.join("shards/seed").display())?;
        writeln!(report, "  dataset card: {}", card.card.display())?;
    }
    let files = crate::sql::query(
        &lake,
        "SELECT f.repo_name, f.pr_number, f.status, f.path, f.old_path, f.additions, f.deletions, f.is_binary, \
         coalesce(f.language, '-') AS language, length(b.content) AS new_chars \
         FROM pr_files f LEFT JOIN file_blobs b ON b.blob_sha = f.new_blob ORDER BY f.repo_name, f.pr_number, f.path",
    )
    .await?;
    writeln!(report, "  files changed by merged PRs (from git):")?;
    for line in arrow::util::pretty::pretty_format_batches(&files)?.to_string().lines() {
        writeln!(report, "    {line}")?;
    }

    // Stage 7: reward (independent of the others; scores the bundled answer samples).
    let cases = samples.join("reward_cases.jsonl");
    if cases.is_file() {
        let pool = rayon::ThreadPoolBuilder::new().build()?;
        let mut out = Vec::new();
        let input = crate::files::open_maybe_gz(&cases)?;
        let b = tokio::task::block_in_place(|| crate::reward::batch::score_stream(input, &mut out, &pool))?;
        let rows: Vec<serde_json::Value> =
            String::from_utf8(out)?.lines().map(serde_json::from_str).collect::<std::result::Result<_, _>>()?;
        writeln!(report, "\n[reward] {} sample answer(s) scored ({} error(s)):", b.scored, b.errors)?;
        for r in rows {
            let reward = r["reward"].as_f64().map_or("error".into(), |v| format!("{v:.4}"));
            let why = r["format_error"].as_str().map(|e| format!("  ({e})")).unwrap_or_default();
            writeln!(report, "  {:<28} {reward:>8}{why}", r["id"].as_str().unwrap_or("?"))?;
        }
    }

    writeln!(report, "\n[tables]")?;
    for t in lake.tables().await? {
        let n = counts(&lake, &format!("SELECT '{t}', count(*) FROM \"{t}\"")).await?;
        writeln!(report, "  {t:<20} {:>6} rows", n.first().map_or(0, |x| x.1))?;
    }
    writeln!(
        report,
        "\nTry: swelake sql --lake {} \"SELECT repo_name, count(*) AS n FROM events GROUP BY repo_name ORDER BY n DESC LIMIT 5\"",
        lake_dir.display()
    )?;
    writeln!(report, "     analyst queries to adapt: sql/examples/*.sql")?;
    writeln!(
        report,
        "     look at it in a browser (status, hours, SQL, instances): swelake serve --lake {}",
        lake_dir.display()
    )?;
    if lake.has_table("rl_seed").await? {
        writeln!(
            report,
            "     GRPO on the seed shards (tiny random policy; --model smollm2 for the real one):\n       \
             swelake train --online --seed-shards '{}/shards/seed/*.parquet' --split '' --model tiny-bpe \
             --steps 2 --group-size 4 --max-new-tokens 32 --out runs/demo",
            lake_dir.display()
        )?;
    }
    Ok(report)
}
