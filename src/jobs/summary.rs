//! What a job did ([`JobSummary`]): printed by the CLI, recorded in `_job_runs`, and made
//! from every stage's own summary.

use super::*;

/// What one job did, as printed by the CLI and recorded in `_job_runs`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobSummary {
    pub job: String,
    /// Input partitions processed in this run.
    pub partitions: Vec<String>,
    pub rows_out: u64,
    /// Extra figures a job reports (e.g. PRs with unknown merge state).
    pub notes: BTreeMap<String, i64>,
    /// Files written outside the lake's tables (the seed shards).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    pub skipped_reason: Option<String>,
    pub seconds: f64,
}

impl JobSummary {
    pub(crate) fn named(job: &str) -> JobSummary {
        JobSummary { job: job.to_string(), ..Default::default() }
    }

    pub(crate) fn skipped(job: &str, reason: impl Into<String>) -> JobSummary {
        JobSummary { job: job.to_string(), skipped_reason: Some(reason.into()), ..Default::default() }
    }

    pub fn render(&self) -> String {
        if let Some(r) = &self.skipped_reason {
            return format!("{:<16} skipped: {r}\n", self.job);
        }
        let mut s = if self.partitions.is_empty() {
            format!("{:<16} up to date\n", self.job)
        } else {
            format!(
                "{:<16} {} partition(s) [{}] -> {} row(s) in {:.2}s\n",
                self.job,
                self.partitions.len(),
                abbreviate(&self.partitions),
                self.rows_out,
                self.seconds
            )
        };
        for (k, v) in &self.notes {
            s.push_str(&format!("{:<16}   {k}: {v}\n", ""));
        }
        s
    }
}

pub(crate) fn abbreviate(parts: &[String]) -> String {
    match parts.len() {
        0 => String::new(),
        1..=3 => parts.join(", "),
        n => format!("{} .. {} ({n})", parts[0], parts[n - 1]),
    }
}

impl From<crate::ingest::IngestSummary> for JobSummary {
    fn from(s: crate::ingest::IngestSummary) -> JobSummary {
        JobSummary {
            partitions: s.files.iter().filter(|f| !f.skipped).map(|f| f.key.clone()).collect(),
            rows_out: s.events_written,
            notes: BTreeMap::from([("rejected_lines".to_string(), s.rejected as i64)]),
            ..Default::default()
        }
    }
}

impl From<crate::snapshots::SnapshotSummary> for JobSummary {
    fn from(s: crate::snapshots::SnapshotSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_snapshotted".to_string(), s.prs_snapshotted as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("prs_failed".to_string(), s.prs_failed as i64),
            ("files".to_string(), s.files as i64),
            ("new_blobs".to_string(), s.new_blobs as i64),
        ]);
        for (reason, n) in &s.failures_by_reason {
            notes.insert(format!("failed:{reason}"), *n as i64);
        }
        let mut partitions = s.repos_processed.clone();
        partitions.sort();
        JobSummary { partitions, rows_out: s.files as u64, notes, ..Default::default() }
    }
}

impl From<crate::prs::from_git::GitPrSummary> for JobSummary {
    fn from(s: crate::prs::from_git::GitPrSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("repos_unchanged".to_string(), s.repos_unchanged as i64),
            ("commits_read".to_string(), s.commits as i64),
            ("prs_found".to_string(), s.prs as i64),
            ("prs_new_or_changed".to_string(), s.prs_new_or_changed as i64),
            ("numbers_claimed_twice".to_string(), s.ambiguous as i64),
        ]);
        for (k, v) in &s.prs_by_kind {
            notes.insert(format!("kind:{k}"), *v as i64);
        }
        for (k, v) in &s.failures_by_reason {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        if s.commits > 0 {
            notes.insert("ms_per_1000_commits".to_string(), (s.scan_seconds * 1e6 / s.commits as f64).round() as i64);
        }
        JobSummary { partitions: s.repos_scanned, rows_out: s.prs as u64, notes, ..Default::default() }
    }
}

impl From<crate::relevance::RelevanceSummary> for JobSummary {
    fn from(s: crate::relevance::RelevanceSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("prs_ranked".to_string(), s.prs as i64),
            ("prs_already_done".to_string(), s.prs_already_done as i64),
            ("candidates".to_string(), s.candidates as i64),
            ("chunks_embedded".to_string(), s.embedded_chunks as i64),
            ("embedding_cache_hit_percent".to_string(), (100.0 * s.embedding_cache_hit_rate).round() as i64),
            ("training_cases".to_string(), s.training_cases as i64),
            ("fit_ms".to_string(), (1000.0 * s.fit_seconds).round() as i64),
            ("fits".to_string(), s.fits as i64),
            ("fits_reused".to_string(), s.fits_reused as i64),
            ("rank_ms".to_string(), (1000.0 * s.rank_seconds).round() as i64),
        ]);
        for (k, v) in &s.failures {
            notes.insert(format!("failed:{k}"), *v as i64);
        }
        let partitions = if s.prs > 0 { vec![format!("{} PR(s)", s.prs)] } else { Vec::new() };
        JobSummary { partitions, rows_out: s.rows as u64, notes, ..Default::default() }
    }
}

impl From<crate::seed::SeedSummary> for JobSummary {
    fn from(s: crate::seed::SeedSummary) -> JobSummary {
        let mut notes = BTreeMap::from([
            ("instances".to_string(), s.instances as i64),
            ("train".to_string(), s.train as i64),
            ("test".to_string(), s.test as i64),
            ("excluded_by_split".to_string(), s.excluded as i64),
            ("shards".to_string(), s.shards.len() as i64),
            ("relevant_files_dropped_for_budget".to_string(), s.relevant_files_dropped_for_budget as i64),
            ("mean_prompt_tokens".to_string(), s.mean_prompt_tokens.round() as i64),
        ]);
        for (k, v) in &s.rejected {
            notes.insert(format!("rejected:{k}"), *v as i64);
        }
        JobSummary { rows_out: s.instances as u64, notes, files: s.shards, ..Default::default() }
    }
}
