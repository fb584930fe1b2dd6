//! `swelake report`: a dataset card — Markdown with PNG charts — of what a lake's seed dataset
//! is made of: PRs kept and rejected by reason, changed files and lines per PR, languages,
//! prompt lengths, linked issues per PR. What a trainer looks at before using a dataset.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use plotters::prelude::*;

use crate::lake::Lake;

const FONT: &str = "swelake-sans";

/// Registers a TTF font for chart text: the system's DejaVu Sans, else the copy in the
/// matplotlib wheel (fetched into the cache).
fn ensure_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let system = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];
        let bytes = match system.iter().find(|p| Path::new(p).exists()) {
            Some(p) => std::fs::read(p).map_err(|e| e.to_string())?,
            None => {
                let p = crate::models::fetch(&crate::models::WheelFile {
                    package: "matplotlib",
                    version: "3.11.2",
                    member: "matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf",
                })
                .map_err(|e| format!("{e:#}"))?;
                std::fs::read(p).map_err(|e| e.to_string())?
            }
        };
        // The font lives for the whole process, as plotters requires.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes).map_err(|_| "not a usable font".to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// A horizontal-ish bar chart of labelled counts.
fn bar_chart(path: &Path, title: &str, items: &[(String, f64)]) -> Result<()> {
    ensure_font()?;
    let root = BitMapBackend::new(path, (900, 120 + 28 * items.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let max = items.iter().map(|x| x.1).fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(240)
        .build_cartesian_2d(0.0..max * 1.1, 0..items.len().max(1))
        .map_err(|e| anyhow!("{e}"))?;
    let labels: Vec<String> = items.iter().map(|x| x.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(items.len().max(1))
        .y_label_formatter(&|i| labels.get(*i).cloned().unwrap_or_default())
        .label_style((FONT, 15))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(
            items
                .iter()
                .enumerate()
                .map(|(i, (_, v))| Rectangle::new([(0.0, i), (*v, i + 1)], RGBColor(70, 110, 180).filled())),
        )
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// A histogram of values in `bins` equal-width bins.
fn histogram(path: &Path, title: &str, x_label: &str, values: &[f64], bins: usize) -> Result<()> {
    ensure_font()?;
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (lo, hi) = values.iter().fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
    let (lo, hi) = if values.is_empty() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo - 0.5, hi + 0.5)
    };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0u32; bins];
    for v in values {
        let b = (((v - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(lo..hi, 0u32..top + top / 10 + 1)
        .map_err(|e| anyhow!("{e}"))?;
    chart.configure_mesh().x_desc(x_label).y_desc("PRs").label_style((FONT, 14)).draw().map_err(|e| anyhow!("{e}"))?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, c)| {
            let x0 = lo + width * i as f64;
            Rectangle::new([(x0, 0), (x0 + width * 0.95, *c)], RGBColor(70, 150, 110).filled())
        }))
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

async fn pairs(lake: &Lake, sql: &str) -> Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    for b in crate::sql::query(lake, sql).await? {
        let k = arrow::compute::cast(b.column(0), &DataType::Utf8)?;
        let v = arrow::compute::cast(b.column(1), &DataType::Float64)?;
        let (k, v) = (k.as_string::<i32>(), v.as_primitive::<arrow::datatypes::Float64Type>());
        for r in 0..b.num_rows() {
            out.push((
                if k.is_null(r) { "(none)".into() } else { k.value(r).to_string() },
                if v.is_null(r) { 0.0 } else { v.value(r) },
            ));
        }
    }
    Ok(out)
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

/// Writes `card.md` and its charts into `out`; returns the card's path.
pub async fn write(lake: &Lake, out: &Path) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for t in ["pr_quality", "rl_seed"] {
        if !lake.has_table(t) {
            anyhow::bail!("no `{t}` table: run the jobs through seed first (swelake run --all ...)");
        }
    }
    let mut md = String::new();
    writeln!(md, "# Dataset card: SWE-RL seed from {}\n", lake.root().display())?;
    let totals = pairs(lake, "SELECT 'kept', count(*) FROM pr_quality WHERE keep UNION ALL SELECT 'rejected', count(*) FROM pr_quality WHERE NOT keep").await?;
    let splits = pairs(lake, "SELECT split, count(*) FROM rl_seed GROUP BY split ORDER BY split").await?;
    let repos = pairs(lake, "SELECT 'repos', count(DISTINCT repo_name) FROM rl_seed").await?;
    writeln!(md, "| | count |\n|---|---|")?;
    for (k, v) in totals.iter().chain(&repos) {
        writeln!(md, "| PRs {k} | {v:.0} |")?;
    }
    for (k, v) in &splits {
        writeln!(md, "| instances in {k} | {v:.0} |")?;
    }
    let reasons = pairs(
        lake,
        "SELECT reason, count(*) AS n FROM (SELECT unnest(reasons) AS reason FROM pr_quality) GROUP BY reason ORDER BY n DESC, reason",
    )
    .await?;
    bar_chart(&out.join("rejections.png"), "PRs by rejection reason (a PR can have several)", &reasons)?;
    writeln!(md, "\n## Why PRs were rejected\n\n![rejections](rejections.png)\n\n| reason | PRs |\n|---|---|")?;
    for (k, v) in &reasons {
        writeln!(md, "| `{k}` | {v:.0} |")?;
    }
    let seed_files = "SELECT f.repo_name, f.pr_number, count(*) AS files, sum(f.additions + f.deletions) AS lines \
        FROM pr_files f JOIN rl_seed s ON concat(f.repo_name, '#', CAST(f.pr_number AS VARCHAR)) = s.instance_id \
        GROUP BY f.repo_name, f.pr_number";
    let files: Vec<f64> =
        pairs(lake, &format!("SELECT repo_name, files FROM ({seed_files})")).await?.into_iter().map(|x| x.1).collect();
    let lines: Vec<f64> =
        pairs(lake, &format!("SELECT repo_name, lines FROM ({seed_files})")).await?.into_iter().map(|x| x.1).collect();
    histogram(&out.join("files_per_pr.png"), "Changed files per instance", "files", &files, 10)?;
    histogram(&out.join("lines_per_pr.png"), "Changed lines per instance", "lines added + deleted", &lines, 12)?;
    writeln!(
        md,
        "\n## Size of the changes\n\nFiles: {}. Lines: {}.\n\n![files](files_per_pr.png)\n\n![lines](lines_per_pr.png)",
        stats(&files),
        stats(&lines)
    )?;
    let langs = pairs(
        lake,
        "SELECT CASE WHEN extra_info['language'] = '' THEN '(none)' ELSE extra_info['language'] END AS l, count(*) AS n FROM rl_seed GROUP BY 1 ORDER BY n DESC, l",
    )
    .await?;
    bar_chart(&out.join("languages.png"), "Instances by language of the first changed code file", &langs)?;
    writeln!(md, "\n## Languages\n\n![languages](languages.png)")?;
    let tokens: Vec<f64> = pairs(lake, "SELECT instance_id, extra_info['prompt_tokens'] FROM rl_seed")
        .await?
        .into_iter()
        .map(|x| x.1)
        .collect();
    histogram(&out.join("prompt_tokens.png"), "Prompt length", "tokens", &tokens, 12)?;
    writeln!(md, "\n## Prompts\n\nTokens: {}.\n\n![tokens](prompt_tokens.png)", stats(&tokens))?;
    let links: Vec<f64> =
        pairs(lake, "SELECT s.instance_id, CAST(cardinality(s.extra_info['issue_numbers']) AS DOUBLE) FROM rl_seed s")
            .await?
            .into_iter()
            .map(|x| x.1)
            .collect();
    histogram(&out.join("links_per_pr.png"), "Linked issues per instance", "issues", &links, 5)?;
    writeln!(md, "\n## Linked issues\n\nPer instance: {}.\n\n![links](links_per_pr.png)", stats(&links))?;
    let oracle_bad: Vec<(String, f64)> = pairs(
        lake,
        "SELECT instance_id, extra_info['oracle_reward'] FROM rl_seed WHERE extra_info['oracle_reward'] < 1.0",
    )
    .await?;
    writeln!(
        md,
        "\n## Checks\n\nEvery instance's oracle, written as SEARCH/REPLACE edits, is scored with the reward: {} of {} score below 1.0.",
        oracle_bad.len(),
        tokens.len()
    )?;
    let mut by_reason: BTreeMap<String, f64> = BTreeMap::new();
    if lake.has_table(crate::seed::SEED_REJECTIONS) {
        for (k, v) in pairs(lake, "SELECT reason, count(*) FROM seed_rejections GROUP BY reason").await? {
            by_reason.insert(k, v);
        }
    }
    if !by_reason.is_empty() {
        writeln!(md, "\nKept PRs that could not become instances:\n\n| reason | PRs |\n|---|---|")?;
        for (k, v) in by_reason {
            writeln!(md, "| `{k}` | {v:.0} |")?;
        }
    }
    let path = out.join("card.md");
    std::fs::write(&path, md)?;
    Ok(path)
}

/// Small line charts side by side, one per named series of (x, y) points (training curves).
pub fn line_panels(path: &Path, title: &str, panels: &[(&str, Vec<(f64, f64)>)]) -> Result<()> {
    ensure_font()?;
    let cols = 3usize;
    let rows = panels.len().div_ceil(cols).max(1);
    let root = BitMapBackend::new(path, (1200, 60 + 300 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root.titled(title, (FONT, 24)).map_err(|e| anyhow!("{e}"))?;
    let areas = root.split_evenly((rows, cols));
    for ((name, points), area) in panels.iter().zip(areas.iter()) {
        let finite: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
        let (x0, x1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (y0, y1) = finite.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let (x0, x1) = if finite.is_empty() {
            (0.0, 1.0)
        } else if x1 > x0 {
            (x0, x1)
        } else {
            (x0 - 0.5, x1 + 0.5)
        };
        let (y0, y1) = if finite.is_empty() {
            (0.0, 1.0)
        } else if y1 > y0 {
            let pad = (y1 - y0) * 0.05;
            (y0 - pad, y1 + pad)
        } else {
            (y0 - 0.5, y1 + 0.5)
        };
        let mut chart = ChartBuilder::on(area)
            .caption(*name, (FONT, 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(56)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| anyhow!("{e}"))?;
        chart.configure_mesh().x_desc("step").label_style((FONT, 12)).draw().map_err(|e| anyhow!("{e}"))?;
        chart
            .draw_series(LineSeries::new(finite.iter().copied(), RGBColor(70, 110, 180).stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
