//! Whether the archive's hours are complete: from `source_hours` (what each ingested hour file
//! held, written by ingest), which hours fall far below the same hour of earlier weeks or are
//! missing inside the ingested range.
//!
//! GH Archive's volume follows the week (weekday afternoons are busy, Sunday nights quiet), so
//! an hour is compared with the same hour of the week before it, not with its neighbours. An
//! hour without enough earlier weeks has no baseline yet: it is reported as such, not as
//! complete.

use std::collections::BTreeMap;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::lake::Lake;

use super::SOURCE_HOURS;

/// How an hour is judged (the `[completeness]` section of the config).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CompletenessConfig {
    /// An hour with fewer events than this fraction of its baseline is flagged `low`.
    pub min_ratio: f64,
    /// Earlier weeks the baseline looks back on (the median of their same hour).
    pub weeks: usize,
    /// Earlier weeks that must have the hour before there is a baseline.
    pub min_weeks: usize,
}

impl Default for CompletenessConfig {
    fn default() -> Self {
        CompletenessConfig { min_ratio: 0.2, weeks: 4, min_weeks: 2 }
    }
}

/// An hour that is not known to be complete.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HourFlag {
    pub hour: String,
    /// `low`, `missing`.
    pub reason: String,
    pub events: i64,
    /// The median events of the same hour in earlier weeks.
    pub baseline: Option<f64>,
}

/// The completeness of the ingested range.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Completeness {
    pub first_hour: Option<String>,
    pub last_hour: Option<String>,
    pub hours_ingested: usize,
    pub complete: usize,
    /// Hours without enough earlier weeks to judge.
    pub no_baseline: usize,
    /// Hours far below their baseline, and hours of the range with no file.
    pub flagged: Vec<HourFlag>,
}

/// Judges every hour of `source_hours` (`None` when nothing was ingested yet).
pub async fn assess(lake: &Lake, cfg: &CompletenessConfig) -> Result<Option<Completeness>> {
    if !lake.has_table(SOURCE_HOURS).await? {
        return Ok(None);
    }
    let table = lake.open_table(SOURCE_HOURS).await?;
    let ctx = datafusion::prelude::SessionContext::new();
    table.update_datafusion_session(&ctx.state())?;
    ctx.register_table(SOURCE_HOURS, table.table_provider().await?)?;
    let rows: Vec<(String, i64, i64)> = crate::query::rows(
        &ctx,
        &format!("SELECT hour, CAST(hour_start AS BIGINT), events FROM {SOURCE_HOURS} WHERE hour_start IS NOT NULL"),
    )
    .await?;
    Ok(Some(judge(&rows.into_iter().map(|(h, t, e)| (h, t / 3_600_000_000, e)).collect::<Vec<_>>(), cfg)))
}

/// The verdict over `(key, hour number since the epoch, events)`.
pub fn judge(hours: &[(String, i64, i64)], cfg: &CompletenessConfig) -> Completeness {
    let by_hour: BTreeMap<i64, (&str, i64)> = hours.iter().map(|(k, h, e)| (*h, (k.as_str(), *e))).collect();
    let mut out = Completeness { hours_ingested: by_hour.len(), ..Default::default() };
    let (Some(&first), Some(&last)) = (by_hour.keys().next(), by_hour.keys().next_back()) else { return out };
    out.first_hour = Some(by_hour[&first].0.to_string());
    out.last_hour = Some(by_hour[&last].0.to_string());
    const WEEK: i64 = 24 * 7;
    for h in first..=last {
        let Some(&(key, events)) = by_hour.get(&h) else {
            out.flagged.push(HourFlag { hour: key_of(h), reason: "missing".into(), events: 0, baseline: None });
            continue;
        };
        let mut earlier: Vec<i64> =
            (1..=cfg.weeks as i64).filter_map(|w| by_hour.get(&(h - w * WEEK)).map(|x| x.1)).collect();
        if earlier.len() < cfg.min_weeks.max(1) {
            out.no_baseline += 1;
            continue;
        }
        earlier.sort_unstable();
        let m = earlier.len();
        let median =
            if m % 2 == 1 { earlier[m / 2] as f64 } else { (earlier[m / 2 - 1] + earlier[m / 2]) as f64 / 2.0 };
        if (events as f64) < cfg.min_ratio * median {
            out.flagged.push(HourFlag { hour: key.to_string(), reason: "low".into(), events, baseline: Some(median) });
        } else {
            out.complete += 1;
        }
    }
    out
}

/// The key (`YYYY-MM-DD-H`) of an hour number since the epoch.
fn key_of(hour: i64) -> String {
    chrono::DateTime::from_timestamp(hour * 3600, 0)
        .map_or_else(|| hour.to_string(), |t| t.format("%Y-%m-%d-%-H").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_and_missing_hours_are_flagged_against_the_same_hour_of_earlier_weeks() {
        // Three weeks of one busy and one quiet hour of the week: the quiet hour is normal.
        let base = 480_000; // an hour number (2024-10-04T00)
        let mut hours = Vec::new();
        for w in 0..3 {
            for (offset, events) in [(0, 1000), (1, 1000), (2, 50)] {
                let h = base + w * 168 + offset;
                // Week 3's first hour is cut to 1%.
                let e = if w == 2 && offset == 0 { 10 } else { events };
                hours.push((key_of(h), h, e));
            }
        }
        let cfg = CompletenessConfig { min_ratio: 0.2, weeks: 4, min_weeks: 1 };
        let c = judge(&hours, &cfg);
        let low: Vec<_> = c.flagged.iter().filter(|f| f.reason == "low").collect();
        assert_eq!(low.len(), 1);
        assert_eq!((low[0].hour.clone(), low[0].baseline), (key_of(base + 2 * 168), Some(1000.0)));
        // Week 1 has no baseline; the hours between the weekly samples are missing.
        assert_eq!(c.no_baseline, 3);
        assert_eq!(c.complete, 5, "the quiet hour of weeks 2 and 3 is compared with itself: normal");
        assert_eq!(c.flagged.iter().filter(|f| f.reason == "missing").count(), (3 * 168 - 168 + 3) - 9);
        assert_eq!(key_of(base), "2024-10-04-0");
        // With two weeks required, week 2 has no baseline either.
        let strict = judge(&hours, &CompletenessConfig { min_weeks: 2, ..cfg });
        assert_eq!(strict.no_baseline, 6);
    }
}
