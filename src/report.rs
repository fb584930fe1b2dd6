//! `swelake report`: a dataset card — Markdown with PNG charts — of what a lake's seed dataset
//! is made of: PRs kept and rejected by reason, changed files and lines per PR, languages,
//! prompt lengths, linked issues per PR. What a trainer looks at before using a dataset.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use datafusion::prelude::SessionContext;
use serde::Serialize;

use crate::charts::{bars_png, histogram_png};
use crate::lake::Lake;

/// Settings of a report run.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// Directory for `card.md` and its charts.
    pub out: PathBuf,
    /// How the archive's hours are judged for the card's completeness section.
    pub completeness: crate::archive::CompletenessConfig,
}

/// What a report run wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ReportSummary {
    pub card: PathBuf,
    pub charts: Vec<PathBuf>,
}

/// Labelled counts: a query of (label, count) rows; a NULL label reads as "(none)".
async fn counts(ctx: &SessionContext, sql: &str) -> Result<Vec<(String, u64)>> {
    let rows: Vec<(Option<String>, u64)> =
        crate::query::rows(ctx, sql).await.with_context(|| format!("report query {sql}"))?;
    Ok(rows.into_iter().map(|(k, v)| (k.unwrap_or_else(|| "(none)".into()), v)).collect())
}

/// The numbers of a one-column query, for histograms.
async fn values(ctx: &SessionContext, sql: &str) -> Result<Vec<f64>> {
    crate::query::rows(ctx, sql).await.with_context(|| format!("report query {sql}"))
}

fn stats(values: &[f64]) -> String {
    if values.is_empty() {
        return "none".into();
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    format!("min {:.0}, median {:.0}, p90 {:.0}, max {:.0}", v[0], q(0.5), q(0.9), v[v.len() - 1])
}

/// How merged PRs become instances, step by step with the main reasons lost at each, and the
/// same per repository: what a trainer judges a dataset's coverage by.
async fn write_funnel(ctx: &SessionContext, md: &mut String) -> Result<()> {
    const TOP: usize = 5;
    let one = |sql: &'static str| async move { counts(ctx, sql).await.map(|v| v.first().map_or(0, |x| x.1)) };
    let merged = one("SELECT 'n', count(*) FROM pull_requests WHERE merged").await?;
    let snapshotted = one(
        "SELECT 'n', count(*) FROM pull_requests p JOIN pr_snapshots s ON s.repo_name = p.repo_name AND s.pr_number = p.number \
         WHERE p.merged AND s.status = 'ok'",
    )
    .await?;
    let kept = one("SELECT 'n', count(*) FROM pr_quality WHERE keep").await?;
    let instances = one("SELECT 'n', count(*) FROM rl_seed").await?;
    let snapshot_reasons = counts(
        ctx,
        "SELECT coalesce(s.reason, 'not snapshotted'), count(*) AS n FROM pull_requests p \
         LEFT JOIN pr_snapshots s ON s.repo_name = p.repo_name AND s.pr_number = p.number \
         WHERE p.merged AND (s.status IS NULL OR s.status <> 'ok') GROUP BY 1 ORDER BY n DESC, 1",
    )
    .await?;
    // Each rejected PR counted once, by its first reason (reasons are sorted by name).
    let filter_reasons = counts(
        ctx,
        "SELECT q.reasons[1], count(*) AS n FROM pr_quality q JOIN pr_snapshots s \
         ON s.repo_name = q.repo_name AND s.pr_number = q.pr_number AND s.status = 'ok' \
         WHERE NOT q.keep GROUP BY 1 ORDER BY n DESC, 1",
    )
    .await?;
    let seed_reasons =
        counts(ctx, "SELECT reason, count(*) AS n FROM seed_rejections GROUP BY 1 ORDER BY n DESC, 1").await?;
    let top = |v: &[(String, u64)]| {
        if v.is_empty() {
            return "-".to_string();
        }
        v.iter().take(TOP).map(|(k, n)| format!("`{k}` {n}")).collect::<Vec<_>>().join(", ")
    };
    writeln!(
        md,
        "\n## Funnel\n\n| step | PRs | lost at this step (each PR under its first reason code) |\n|---|---|---|"
    )?;
    writeln!(md, "| merged | {merged} | |")?;
    writeln!(md, "| snapshotted from git | {snapshotted} | {} |", top(&snapshot_reasons))?;
    writeln!(md, "| kept by the filters | {kept} | {} |", top(&filter_reasons))?;
    writeln!(md, "| seed instances | {instances} | {} |", top(&seed_reasons))?;
    // The verify stage's step: instances whose own tests fail before the change and pass after
    // (swelake run verify), the others under their status.
    let verified = one("SELECT 'n', count(*) FROM rl_seed WHERE verified").await?;
    let verify_reasons = counts(
        ctx,
        "SELECT coalesce(v.status, 'not run'), count(*) AS n FROM rl_seed s LEFT JOIN pr_verification v \
         ON v.repo_name = s.repo_name AND v.pr_number = get_field(s.extra_info, 'pr_number') \
         WHERE NOT s.verified GROUP BY 1 ORDER BY n DESC, 1",
    )
    .await?;
    writeln!(md, "| verified by their tests | {verified} | {} |", top(&verify_reasons))?;
    let per_repo: Vec<(String, i64, i64, i64)> = crate::query::rows(
        ctx,
        "WITH m AS (SELECT repo_name, count(*) AS merged FROM pull_requests WHERE merged GROUP BY 1), \
              k AS (SELECT repo_name, count(*) AS kept FROM pr_quality WHERE keep GROUP BY 1), \
              i AS (SELECT repo_name, count(*) AS instances FROM rl_seed GROUP BY 1) \
         SELECT m.repo_name, m.merged, coalesce(k.kept, 0), coalesce(i.instances, 0) FROM m \
         LEFT JOIN k ON k.repo_name = m.repo_name LEFT JOIN i ON i.repo_name = m.repo_name \
         ORDER BY 4 DESC, 2 DESC, 1 LIMIT 30",
    )
    .await
    .context("report query: the funnel per repository")?;
    writeln!(md, "\n| repository | merged | kept | instances |\n|---|---|---|---|")?;
    for (r, m, k, i) in &per_repo {
        writeln!(md, "| {r} | {m} | {k} | {i} |")?;
    }
    Ok(())
}

/// Where the PRs came from, and how complete the archive's hours were: a card over a stretch
/// of GH Archive's thin hours must say so.
async fn write_sources(lake: &Lake, ctx: &SessionContext, opts: &ReportOptions, md: &mut String) -> Result<()> {
    writeln!(md, "\n## Sources\n")?;
    let discovery = counts(
        ctx,
        "SELECT discovery_source, count(*) AS n FROM pull_requests WHERE merged GROUP BY 1 ORDER BY n DESC, 1",
    )
    .await?;
    let problems =
        counts(ctx, "SELECT problem_source, count(*) AS n FROM rl_seed GROUP BY 1 ORDER BY n DESC, 1").await?;
    writeln!(md, "| | count |\n|---|---|")?;
    for (k, v) in &discovery {
        writeln!(md, "| merged PRs found in {k} | {v} |")?;
    }
    for (k, v) in &problems {
        writeln!(md, "| instances whose problem statement is {k} | {v} |")?;
    }
    // The text GH Archive lost (PR bodies since 2025-10) or never had for PRs found in git,
    // read back through GitHub's REST API (`ingest --github`).
    let api_prs =
        counts(ctx, "SELECT 'n', count(*) FROM pull_requests WHERE merged AND metadata_source = 'github_api'").await?;
    let issues_have_source = ctx.table("issues").await?.schema().has_column_with_unqualified_name("metadata_source");
    let api_problems = if issues_have_source {
        counts(
            ctx,
            "SELECT 'n', count(DISTINCT s.instance_id) FROM rl_seed s \
             JOIN pr_issue_links l ON l.repo_name = s.repo_name AND l.pr_number = get_field(s.extra_info, 'pr_number') \
             JOIN issues i ON i.repo_name = l.issue_repo_name AND i.number = l.issue_number \
             WHERE s.problem_source = 'issue' AND i.metadata_source = 'github_api'",
        )
        .await?
    } else {
        Vec::new()
    };
    let n = |c: &[(String, u64)]| c.first().map_or(0, |(_, v)| *v);
    let api = crate::archive::api_sources(lake).await?;
    if !api.is_empty() || n(&api_prs) > 0 || n(&api_problems) > 0 {
        writeln!(md, "| merged PRs whose title and body were read through GitHub's API | {} |", n(&api_prs))?;
        writeln!(
            md,
            "| instances whose problem statement is an issue read through GitHub's API | {} |",
            n(&api_problems)
        )?;
    }
    if !api.is_empty() {
        let total = |f: fn(&crate::archive::ApiSource) -> i64| api.iter().map(f).sum::<i64>();
        writeln!(
            md,
            "\nGitHub's REST API (`swelake ingest --github`) was read for {} {} ({} answered ok): \
             {} calls in all, {} PRs, {} issues, {} comments and {} reviews read.",
            api.len(),
            if api.len() == 1 { "repository" } else { "repositories" },
            api.iter().filter(|r| r.status == "ok").count(),
            total(|r| r.calls_total),
            total(|r| r.prs_total),
            total(|r| r.issues_total),
            total(|r| r.comments_total),
            total(|r| r.reviews_total.unwrap_or(0))
        )?;
    }
    let Some(c) = crate::archive::assess(lake, &opts.completeness).await? else {
        writeln!(md, "\nNo GH Archive hours were ingested into this lake (its PRs come from git).")?;
        return Ok(());
    };
    let low = c.flagged.iter().filter(|f| f.reason == "low").count();
    let missing = c.flagged.len() - low;
    writeln!(
        md,
        "\nGH Archive hours {} to {}: {} ingested, {} complete, {} without a baseline yet \
         (too few earlier weeks), {} far below the same hour of earlier weeks, {} missing of the \
         hours the lake means to hold ({}: {}).",
        c.first_hour.as_deref().unwrap_or("-"),
        c.last_hour.as_deref().unwrap_or("-"),
        c.hours_ingested,
        c.complete,
        c.no_baseline,
        low,
        missing,
        c.expected.mode,
        c.expected.reason
    )?;
    if !c.flagged.is_empty() {
        writeln!(md, "\n| hour | flag | events | baseline |\n|---|---|---|---|")?;
        const SHOWN: usize = 50;
        for f in c.flagged.iter().take(SHOWN) {
            let baseline = f.baseline.map_or("-".to_string(), |b| format!("{b:.0}"));
            writeln!(md, "| {} | {} | {} | {} |", f.hour, f.reason, f.events, baseline)?;
        }
        if c.flagged.len() > SHOWN {
            writeln!(md, "\n({} more: `swelake status --json` lists them all.)", c.flagged.len() - SHOWN)?;
        }
    }
    Ok(())
}

/// Writes `card.md` and its charts into `opts.out`.
pub async fn run(lake: &Lake, opts: &ReportOptions) -> Result<ReportSummary> {
    let out = &opts.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for t in ["pr_quality", "rl_seed"] {
        if !lake.has_table(t).await? {
            anyhow::bail!("no `{t}` table: run the jobs through seed first (swelake run --all ...)");
        }
    }
    crate::lake::runs::refuse_stale_seed(lake).await?;
    let ctx = lake
        .session_with(&[
            "seed_rejections",
            "pr_snapshots",
            "pull_requests",
            "pr_verification",
            "issues",
            "pr_issue_links",
        ])
        .await?;
    let mut charts = Vec::new();
    let mut md = String::new();
    writeln!(md, "# Dataset card: SWE-RL seed from {}\n", lake.location())?;
    let totals = counts(
        &ctx,
        "SELECT 'kept', count(*) FROM pr_quality WHERE keep UNION ALL SELECT 'rejected', count(*) FROM pr_quality WHERE NOT keep",
    )
    .await?;
    let splits = counts(&ctx, "SELECT split, count(*) FROM rl_seed GROUP BY split ORDER BY split").await?;
    let repos = counts(&ctx, "SELECT 'repos', count(DISTINCT repo_name) FROM rl_seed").await?;
    writeln!(md, "| | count |\n|---|---|")?;
    for (k, v) in totals.iter().chain(&repos) {
        writeln!(md, "| PRs {k} | {v} |")?;
    }
    for (k, v) in &splits {
        writeln!(md, "| instances in {k} | {v} |")?;
    }
    let reasons = counts(
        &ctx,
        "SELECT reason, count(*) AS n FROM (SELECT unnest(reasons) AS reason FROM pr_quality) GROUP BY reason ORDER BY n DESC, reason",
    )
    .await?;
    let path = out.join("rejections.png");
    bars_png(&path, "PRs by rejection reason (a PR can have several)", &reasons)?;
    charts.push(path);
    writeln!(md, "\n## Why PRs were rejected\n\n![rejections](rejections.png)\n\n| reason | PRs |\n|---|---|")?;
    for (k, v) in &reasons {
        writeln!(md, "| `{k}` | {v} |")?;
    }
    let seed_files = "SELECT f.repo_name, f.pr_number, CAST(count(*) AS DOUBLE) AS files, \
        CAST(sum(f.additions + f.deletions) AS DOUBLE) AS lines \
        FROM pr_files f JOIN rl_seed s ON concat(f.repo_name, '#', CAST(f.pr_number AS VARCHAR)) = s.instance_id \
        GROUP BY f.repo_name, f.pr_number";
    let files = values(&ctx, &format!("SELECT files FROM ({seed_files})")).await?;
    let lines = values(&ctx, &format!("SELECT lines FROM ({seed_files})")).await?;
    for (name, title, axis, v, bins) in [
        ("files_per_pr.png", "Changed files per instance", "files", &files, 10),
        ("lines_per_pr.png", "Changed lines per instance", "lines added + deleted", &lines, 12),
    ] {
        histogram_png(&out.join(name), title, axis, v, bins)?;
        charts.push(out.join(name));
    }
    writeln!(
        md,
        "\n## Size of the changes\n\nFiles: {}. Lines: {}.\n\n![files](files_per_pr.png)\n\n![lines](lines_per_pr.png)",
        stats(&files),
        stats(&lines)
    )?;
    let langs = counts(
        &ctx,
        "SELECT CASE WHEN extra_info['language'] = '' THEN '(none)' ELSE extra_info['language'] END AS l, count(*) AS n FROM rl_seed GROUP BY 1 ORDER BY n DESC, l",
    )
    .await?;
    let path = out.join("languages.png");
    bars_png(&path, "Instances by language of the first changed code file", &langs)?;
    charts.push(path);
    writeln!(md, "\n## Languages\n\n![languages](languages.png)")?;
    let tokens = values(&ctx, "SELECT CAST(extra_info['prompt_tokens'] AS DOUBLE) FROM rl_seed").await?;
    histogram_png(&out.join("prompt_tokens.png"), "Prompt length", "tokens", &tokens, 12)?;
    charts.push(out.join("prompt_tokens.png"));
    writeln!(md, "\n## Prompts\n\nTokens: {}.\n\n![tokens](prompt_tokens.png)", stats(&tokens))?;
    let links = values(&ctx, "SELECT CAST(cardinality(extra_info['issue_numbers']) AS DOUBLE) FROM rl_seed").await?;
    histogram_png(&out.join("links_per_pr.png"), "Linked issues per instance", "issues", &links, 5)?;
    charts.push(out.join("links_per_pr.png"));
    writeln!(md, "\n## Linked issues\n\nPer instance: {}.\n\n![links](links_per_pr.png)", stats(&links))?;
    let oracle_bad: Vec<String> =
        crate::query::rows(&ctx, "SELECT instance_id FROM rl_seed WHERE extra_info['oracle_reward'] < 1.0").await?;
    writeln!(
        md,
        "\n## Checks\n\nEvery instance's oracle, written as SEARCH/REPLACE edits, is scored with the reward: {} of {} score below 1.0.",
        oracle_bad.len(),
        tokens.len()
    )?;
    let by_reason: BTreeMap<String, u64> =
        counts(&ctx, "SELECT reason, count(*) FROM seed_rejections GROUP BY reason").await?.into_iter().collect();
    if !by_reason.is_empty() {
        writeln!(md, "\nKept PRs that could not become instances:\n\n| reason | PRs |\n|---|---|")?;
        for (k, v) in by_reason {
            writeln!(md, "| `{k}` | {v} |")?;
        }
    }
    write_sources(lake, &ctx, opts, &mut md).await?;
    write_funnel(&ctx, &mut md).await?;
    let card = out.join("card.md");
    std::fs::write(&card, md)?;
    Ok(ReportSummary { card, charts })
}
