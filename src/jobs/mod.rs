//! Scheduled, incremental jobs. `runs` is the `_job_runs` table: one row per job, partition
//! and attempt, which is both the audit log and the watermark later runs consult.

pub mod runs;
