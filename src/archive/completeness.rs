//! Whether the archive's hours are complete: from `source_hours` (what each ingested hour file
//! held, written by ingest), which hours fall far below the same hour of earlier weeks or are
//! missing inside the ingested range.
//!
//! GH Archive's volume follows the week (weekday afternoons are busy, Sunday nights quiet), so
//! an hour is compared with the same hour of the week before it, not with its neighbours. An
//! hour without enough earlier weeks has no baseline yet: it is reported as such, not as
//! complete.
//!
//! A lake may hold a sample of hours on purpose (the demo holds two hours ten months apart):
//! the config's `expect` says which hours it means to hold, so that only those can be missing.

use std::collections::{BTreeMap, BTreeSet};

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
    /// Which hours the lake means to hold: only those can be missing.
    pub expect: Expect,
}

impl Default for CompletenessConfig {
    fn default() -> Self {
        CompletenessConfig { min_ratio: 0.2, weeks: 4, min_weeks: 2, expect: Expect::Auto }
    }
}

/// Which hours a lake means to hold (`expect` in the config: a word or a list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "ExpectRepr", into = "ExpectRepr")]
pub enum Expect {
    /// `"auto"`: `range` when the hours held cover at least half of their range, else `days`
    /// when they cover at least half of their days, else `held` (a sample).
    Auto,
    /// `"range"`: every hour from the first ingested to the last.
    Range,
    /// `"days"`: every hour of each day that has an hour ingested.
    Days,
    /// `"held"`: only the hours ingested (a sample); none can be missing.
    Held,
    /// A list of hours (`YYYY-MM-DD-H`) and whole days (`YYYY-MM-DD`).
    List(Vec<String>),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ExpectRepr {
    Word(String),
    List(Vec<String>),
}

impl TryFrom<ExpectRepr> for Expect {
    type Error = String;
    fn try_from(r: ExpectRepr) -> Result<Expect, String> {
        match r {
            ExpectRepr::Word(w) => match w.as_str() {
                "auto" => Ok(Expect::Auto),
                "range" => Ok(Expect::Range),
                "days" => Ok(Expect::Days),
                "held" => Ok(Expect::Held),
                _ => Err(format!(
                    "expect = {w:?}: say \"auto\", \"range\", \"days\", \"held\" or a list of hours \
                     (YYYY-MM-DD-H) and days (YYYY-MM-DD)"
                )),
            },
            ExpectRepr::List(l) => {
                for x in &l {
                    if expected_hours_of(x).is_none() {
                        return Err(format!("expect: {x:?} is neither an hour (YYYY-MM-DD-H) nor a day (YYYY-MM-DD)"));
                    }
                }
                Ok(Expect::List(l))
            }
        }
    }
}

impl From<Expect> for ExpectRepr {
    fn from(e: Expect) -> ExpectRepr {
        match e {
            Expect::Auto => ExpectRepr::Word("auto".into()),
            Expect::Range => ExpectRepr::Word("range".into()),
            Expect::Days => ExpectRepr::Word("days".into()),
            Expect::Held => ExpectRepr::Word("held".into()),
            Expect::List(l) => ExpectRepr::List(l),
        }
    }
}

/// The hour numbers a list entry names: one hour, or a day's 24.
fn expected_hours_of(s: &str) -> Option<Vec<i64>> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        let h0 = d.and_hms_opt(0, 0, 0)?.and_utc().timestamp() / 3600;
        return Some((h0..h0 + 24).collect());
    }
    let h = super::Hour::parse(s)?;
    Some(vec![h.0.and_utc().timestamp() / 3600])
}

/// The hours a lake means to hold, as resolved from [`Expect`] and the hours it holds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Expected {
    /// `range`, `days`, `held` or `list`.
    pub mode: String,
    /// Why, in words (for `auto`: the coverage that chose the mode).
    pub reason: String,
    #[serde(skip)]
    hours: BTreeSet<i64>,
}

impl Expect {
    /// Resolves the expectation over the hour numbers held.
    pub fn resolve(&self, held: &BTreeSet<i64>) -> Expected {
        let (Some(&first), Some(&last)) = (held.first(), held.last()) else {
            return Expected { mode: "held".into(), reason: "no hour ingested".into(), hours: BTreeSet::new() };
        };
        let days: BTreeSet<i64> = held.iter().map(|h| h.div_euclid(24)).collect();
        let range = || (first..=last).collect::<BTreeSet<i64>>();
        let whole_days = || days.iter().flat_map(|d| d * 24..d * 24 + 24).collect::<BTreeSet<i64>>();
        let e = |mode: &str, reason: String, hours| Expected { mode: mode.into(), reason, hours };
        match self {
            Expect::Range => e("range", "config: every hour of the range".into(), range()),
            Expect::Days => e("days", "config: every hour of the days held".into(), whole_days()),
            Expect::Held => e("held", "config: only the hours held".into(), held.clone()),
            Expect::List(l) => e(
                "list",
                format!("config: {} listed hours and days", l.len()),
                l.iter().flat_map(|x| expected_hours_of(x).unwrap_or_default()).collect(),
            ),
            Expect::Auto => {
                let span = (last - first + 1) as f64;
                let of_days = (days.len() * 24) as f64;
                let n = held.len() as f64;
                let (held_n, nd) = (held.len(), days.len());
                if n >= 0.5 * span {
                    e("range", format!("auto: {held_n} hours held of the {span} in their range"), range())
                } else if n >= 0.5 * of_days {
                    e("days", format!("auto: {held_n} hours held over {nd} days, a sample of whole days"), whole_days())
                } else {
                    e(
                        "held",
                        format!("auto: {held_n} hours held over {nd} days of a {span}-hour range, a sample of hours"),
                        held.clone(),
                    )
                }
            }
        }
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
    /// Which hours the lake means to hold: only those can be missing.
    pub expected: Expected,
    pub first_hour: Option<String>,
    pub last_hour: Option<String>,
    pub hours_ingested: usize,
    pub complete: usize,
    /// Hours without enough earlier weeks to judge.
    pub no_baseline: usize,
    /// Hours far below their baseline, and expected hours with no file.
    pub flagged: Vec<HourFlag>,
}

/// One hour of the ingested range as [`hours`] judges it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HourVerdict {
    /// `YYYY-MM-DD-H`.
    pub hour: String,
    /// `complete`, `low`, `missing`, `no_baseline` (too few earlier weeks) or `not_expected`
    /// (not ingested, and the lake does not mean to hold it).
    pub verdict: &'static str,
    /// What the hour file held (`None`: not ingested).
    pub events: Option<i64>,
    pub rejected: Option<i64>,
    pub repos: Option<i64>,
    pub pr_events: Option<i64>,
    /// The median events of the same hour in earlier weeks.
    pub baseline: Option<f64>,
}

/// Every hour of the ingested range with its verdict: the heatmap's cells.
#[derive(Debug, Clone, Serialize)]
pub struct HoursView {
    pub expected: Expected,
    pub first_hour: Option<String>,
    pub last_hour: Option<String>,
    pub hours: Vec<HourVerdict>,
}

/// What an hour file held: (key, hour number since the epoch, events, rejected, repos, PR events).
type HeldRow = (String, i64, i64, i64, i64, i64);

async fn held_rows(lake: &Lake) -> Result<Option<Vec<HeldRow>>> {
    if !lake.has_table(SOURCE_HOURS).await? {
        return Ok(None);
    }
    let table = lake.open_table(SOURCE_HOURS).await?;
    let ctx = datafusion::prelude::SessionContext::new();
    table.update_datafusion_session(&ctx.state())?;
    ctx.register_table(SOURCE_HOURS, table.table_provider().await?)?;
    let rows: Vec<HeldRow> = crate::query::rows(
        &ctx,
        &format!(
            "SELECT hour, CAST(hour_start AS BIGINT) AS t, events, rejected, repos, pr_events FROM {SOURCE_HOURS} \
             WHERE hour_start IS NOT NULL ORDER BY t"
        ),
    )
    .await?;
    Ok(Some(rows.into_iter().map(|(k, t, e, r, p, q)| (k, t / 3_600_000_000, e, r, p, q)).collect()))
}

/// Every hour from the first ingested to the last (and every listed one), judged.
pub async fn hours(lake: &Lake, cfg: &CompletenessConfig) -> Result<Option<HoursView>> {
    let Some(rows) = held_rows(lake).await? else { return Ok(None) };
    let by_hour: BTreeMap<i64, &HeldRow> = rows.iter().map(|r| (r.1, r)).collect();
    let triples: Vec<(String, i64, i64)> = rows.iter().map(|r| (r.0.clone(), r.1, r.2)).collect();
    let (verdicts, c) = classify(&triples, cfg);
    let hours = verdicts
        .into_iter()
        .map(|(h, verdict, baseline)| {
            let r = by_hour.get(&h);
            HourVerdict {
                hour: r.map_or_else(|| key_of(h), |r| r.0.clone()),
                verdict,
                events: r.map(|r| r.2),
                rejected: r.map(|r| r.3),
                repos: r.map(|r| r.4),
                pr_events: r.map(|r| r.5),
                baseline,
            }
        })
        .collect();
    Ok(Some(HoursView { expected: c.expected, first_hour: c.first_hour, last_hour: c.last_hour, hours }))
}

/// Judges every hour of `source_hours` (`None` when nothing was ingested yet).
pub async fn assess(lake: &Lake, cfg: &CompletenessConfig) -> Result<Option<Completeness>> {
    let Some(rows) = held_rows(lake).await? else { return Ok(None) };
    Ok(Some(judge(&rows.into_iter().map(|r| (r.0, r.1, r.2)).collect::<Vec<_>>(), cfg)))
}

/// The verdict over `(key, hour number since the epoch, events)`.
pub fn judge(hours: &[(String, i64, i64)], cfg: &CompletenessConfig) -> Completeness {
    classify(hours, cfg).1
}

/// An hour number since the epoch, its verdict and its baseline.
type Verdict = (i64, &'static str, Option<f64>);

/// Each hour of the range (and every expected hour beyond it) with its verdict and baseline,
/// in time order, and the summary.
fn classify(hours: &[(String, i64, i64)], cfg: &CompletenessConfig) -> (Vec<Verdict>, Completeness) {
    let by_hour: BTreeMap<i64, (&str, i64)> = hours.iter().map(|(k, h, e)| (*h, (k.as_str(), *e))).collect();
    let held: BTreeSet<i64> = by_hour.keys().copied().collect();
    let expected = cfg.expect.resolve(&held);
    let mut out = Completeness { hours_ingested: by_hour.len(), ..Default::default() };
    let mut verdicts = Vec::new();
    let (Some(&first), Some(&last)) = (held.first(), held.last()) else {
        out.expected = expected;
        return (verdicts, out);
    };
    out.first_hour = Some(by_hour[&first].0.to_string());
    out.last_hour = Some(by_hour[&last].0.to_string());
    const WEEK: i64 = 24 * 7;
    let lo = expected.hours.first().map_or(first, |&e| e.min(first));
    let hi = expected.hours.last().map_or(last, |&e| e.max(last));
    for h in lo..=hi {
        let Some(&(key, events)) = by_hour.get(&h) else {
            if expected.hours.contains(&h) {
                out.flagged.push(HourFlag { hour: key_of(h), reason: "missing".into(), events: 0, baseline: None });
                verdicts.push((h, "missing", None));
            } else if (first..=last).contains(&h) {
                verdicts.push((h, "not_expected", None));
            }
            continue;
        };
        let mut earlier: Vec<i64> =
            (1..=cfg.weeks as i64).filter_map(|w| by_hour.get(&(h - w * WEEK)).map(|x| x.1)).collect();
        if earlier.len() < cfg.min_weeks.max(1) {
            out.no_baseline += 1;
            verdicts.push((h, "no_baseline", None));
            continue;
        }
        earlier.sort_unstable();
        let m = earlier.len();
        let median =
            if m % 2 == 1 { earlier[m / 2] as f64 } else { (earlier[m / 2 - 1] + earlier[m / 2]) as f64 / 2.0 };
        if (events as f64) < cfg.min_ratio * median {
            out.flagged.push(HourFlag { hour: key.to_string(), reason: "low".into(), events, baseline: Some(median) });
            verdicts.push((h, "low", Some(median)));
        } else {
            out.complete += 1;
            verdicts.push((h, "complete", Some(median)));
        }
    }
    out.expected = expected;
    (verdicts, out)
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
        let cfg = CompletenessConfig { min_ratio: 0.2, weeks: 4, min_weeks: 1, expect: Expect::Range };
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

    #[test]
    fn a_sample_of_hours_is_not_missing_the_rest_of_its_range() {
        // The demo's two hours ten months apart: a sample, nothing missing.
        let hours = vec![("2015-01-01-15".to_string(), 394_479, 100), ("2025-11-01-15".to_string(), 489_447, 100)];
        let c = judge(&hours, &CompletenessConfig::default());
        assert_eq!((c.expected.mode.as_str(), c.flagged.len()), ("held", 0), "{:?}", c.expected);
        // Said as a range, every hour between them is missing.
        let range = judge(&hours, &CompletenessConfig { expect: Expect::Range, ..Default::default() });
        assert_eq!(range.flagged.len(), 489_447 - 394_479 - 1);
        // Whole days: 23 missing hours on each day.
        let days = judge(&hours, &CompletenessConfig { expect: Expect::Days, ..Default::default() });
        assert_eq!(days.flagged.len(), 46);
        // A list names what is meant: one listed hour absent.
        let list = Expect::List(vec!["2015-01-01-15".into(), "2015-01-01-16".into()]);
        let l = judge(&hours, &CompletenessConfig { expect: list, ..Default::default() });
        assert_eq!(l.flagged.iter().map(|f| f.hour.as_str()).collect::<Vec<_>>(), ["2015-01-01-16"]);
        // A continuous stretch with a gap reads as a range: the gap is missing.
        let mut run: Vec<_> = (0..48).filter(|h| *h != 30).map(|h| (key_of(480_000 + h), 480_000 + h, 10)).collect();
        run.push((key_of(480_060), 480_060, 10));
        let r = judge(&run, &CompletenessConfig::default());
        assert_eq!(r.expected.mode, "range");
        assert_eq!(r.flagged.len(), 1 + 12);
        // The config's words and lists parse, and a wrong word says what is allowed.
        let parse = |t: &str| toml::from_str::<CompletenessConfig>(t).map(|c| c.expect);
        assert_eq!(parse("expect = \"days\"").unwrap(), Expect::Days);
        assert_eq!(parse("expect = [\"2025-11-01\"]").unwrap(), Expect::List(vec!["2025-11-01".into()]));
        let err = parse("expect = \"some\"").unwrap_err().to_string();
        assert!(err.contains("\"range\""), "{err}");
        assert!(parse("expect = [\"2025-13-01\"]").is_err());
    }
}
