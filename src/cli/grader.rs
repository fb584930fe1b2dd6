//! `swelake grade-server`: the grader over HTTP, for trainers that are not swelake (verl, TRL,
//! OpenRLHF): environments stay warm between batches, and every patch runs in the sandbox.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use serde::Deserialize;
use serde_json::{json, Value};
use swelake_reward::modes::{self, Mode};

use super::args::GradeArgs;
use super::{parse_size, Ctx};
use crate::verify::grade::Grader;

#[derive(Args, Debug)]
#[command(after_help = "\
POST /grade with `Authorization: Bearer TOKEN` and a JSON body
  {\"mode\": \"hybrid\", \"items\": [{\"instance_id\": \"owner/name#N\", \"completion\": \"<think>..</think><solution>..</solution>\"},
                                {\"instance_id\": \"owner__name-N\", \"patch\": \"diff --git ...\"}]}
answers {\"results\": [{\"reward\", \"reward_similarity\", \"reward_tests\", \"reward_hybrid\", \"resolved\",
\"f2p_passed\", \"f2p_total\", \"p2p_passed\", \"p2p_total\", \"status\", \"reason\", \"seconds\",
\"format_error\", \"error\"}, ...]} in the items' order. A completion's patch is read as
`swelake reward` reads it (its search/replace edits applied to the instance's context files from
the lake's seed shards, or the unified diff it carries). Only verified instances of the lake are
graded; a patch over --max-patch-bytes is refused unrun; every patch runs in the sandbox with
no network, no host files and none of this server's environment. GET /health answers the
instance count. Batches are graded one after another, each on --grade-jobs sandboxes.

In Python (the swelake_reward package): compute_score_tests / compute_score_tests_batch (verl)
and tests_reward (TRL's reward_funcs), with SWELAKE_GRADER_URL and SWELAKE_GRADER_TOKEN.

Example:
  SWELAKE_GRADER_TOKEN=s3cret swelake grade-server --lake lake --repo-url 'file:///srv/git/{repo}.git' --bind 127.0.0.1:8091")]
pub(crate) struct GraderArgs {
    #[command(flatten)]
    grade: GradeArgs,
    /// Address to listen on; loopback unless you put a TLS proxy in front.
    #[arg(long, default_value = "127.0.0.1:8091")]
    bind: SocketAddr,
    /// The secret clients send as `Authorization: Bearer TOKEN` (required).
    #[arg(long, env = "SWELAKE_GRADER_TOKEN", hide_env_values = true)]
    token: String,
    /// Patches larger than this are refused without running: 1MiB, 256KiB.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    max_patch_bytes: u64,
    /// Items in one request at most.
    #[arg(long, default_value_t = 4096)]
    max_items: usize,
    /// Seed shards (glob) for the instances' context files [default: LAKE/shards/seed/part-*.parquet].
    #[arg(long)]
    seed_shards: Option<String>,
}

struct Service {
    grader: Grader,
    seed: HashMap<String, (crate::reward::rollouts::Files, crate::reward::rollouts::Files)>,
    token: String,
    max_items: usize,
    /// One batch at a time: each already uses every grading slot.
    busy: tokio::sync::Mutex<()>,
}

impl GraderArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        if self.token.trim().is_empty() {
            bail!("--token (or SWELAKE_GRADER_TOKEN) must not be empty");
        }
        if self.grade.lake.is_none() {
            bail!("--lake is needed: the server grades that lake's verified instances");
        }
        let mut grader = self.grade.open(ctx).await?.context("a lake was given")?;
        grader.max_patch_bytes = self.max_patch_bytes as usize;
        let mut keep = Vec::new();
        let shards =
            super::local_glob(self.seed_shards.clone().or(self.grade.seed_shards()), &ctx.given, &mut keep).await?;
        let seed = match shards.as_deref().map(crate::train::data::seed_lookup) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                eprintln!("grade-server: no seed shards ({e:#}): only items with a `patch` can be graded");
                HashMap::new()
            }
            None => HashMap::new(),
        };
        let svc = Arc::new(Service {
            grader,
            seed,
            token: self.token.clone(),
            max_items: self.max_items,
            busy: tokio::sync::Mutex::new(()),
        });
        let body_limit = (self.max_patch_bytes as usize).saturating_mul(4).max(1 << 20).saturating_mul(64);
        let app = Router::new()
            .route("/health", get(health))
            .route("/grade", post(grade))
            .layer(DefaultBodyLimit::max(body_limit))
            .with_state(svc.clone());
        let listener =
            tokio::net::TcpListener::bind(self.bind).await.with_context(|| format!("binding {}", self.bind))?;
        eprintln!(
            "grade-server: http://{}/grade, {} verified instance(s), {} context(s)",
            listener.local_addr()?,
            svc.grader.instance_count(),
            svc.seed.len()
        );
        // Stopped by Ctrl-C or a service manager's SIGTERM: the grader's scratch trees go with it.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            })
            .await?;
        drop(svc);
        eprintln!("grade-server: stopped");
        Ok(ExitCode::SUCCESS)
    }
}

fn authorized(svc: &Service, headers: &HeaderMap) -> bool {
    let sent = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    sent.is_some_and(|t| {
        t.len() == svc.token.len() && t.bytes().zip(svc.token.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
    })
}

fn refuse(code: StatusCode, msg: &str) -> Response {
    (code, Json(json!({ "error": msg }))).into_response()
}

async fn health(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    if !authorized(&svc, &headers) {
        return refuse(StatusCode::UNAUTHORIZED, "send `Authorization: Bearer TOKEN`");
    }
    Json(json!({"instances": svc.grader.instance_count(), "jobs": svc.grader.jobs()})).into_response()
}

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    mode: Option<String>,
    items: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    instance_id: String,
    #[serde(default)]
    completion: Option<String>,
    #[serde(default)]
    patch: Option<String>,
}

async fn grade(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<Json<Request>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if !authorized(&svc, &headers) {
        return refuse(StatusCode::UNAUTHORIZED, "send `Authorization: Bearer TOKEN`");
    }
    let req = match body {
        Ok(Json(r)) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.body_text()),
    };
    let mode = match req.mode.as_deref().unwrap_or("tests").parse::<Mode>() {
        Ok(m) => m,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e),
    };
    if req.items.len() > svc.max_items {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("{} items, over the limit of {}", req.items.len(), svc.max_items),
        );
    }
    let _turn = svc.busy.lock().await;
    let svc2 = svc.clone();
    match tokio::task::spawn_blocking(move || grade_items(&svc2, mode, &req.items)).await {
        Ok(results) => Json(json!({ "results": results })).into_response(),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, &format!("grading failed: {e}")),
    }
}

/// Each item's patch, the instance's tests run on it, every mode's reward.
fn grade_items(svc: &Service, mode: Mode, items: &[Item]) -> Vec<Value> {
    let empty = crate::reward::rollouts::Files::new();
    let mut answers = Vec::with_capacity(items.len());
    for it in items {
        let seed_id = svc.grader.instance(&it.instance_id).map(|i| i.seed_id()).unwrap_or(it.instance_id.clone());
        let (context, oracle) = svc.seed.get(&seed_id).map_or((&empty, &empty), |(c, o)| (c, o));
        let a = match (&it.completion, &it.patch) {
            (Some(c), _) if svc.seed.contains_key(&seed_id) => {
                modes::answer(context, oracle, c).map_err(|e| e.to_string())
            }
            (Some(c), _) => match modes::extract_diff(c) {
                Some(d) => Ok(raw_patch(d, context, oracle)),
                None => Err(format!("{} has no context files here: send a `patch`", it.instance_id)),
            },
            (None, Some(p)) => Ok(raw_patch(p, context, oracle)),
            (None, None) => Err("an item needs a `completion` or a `patch`".to_string()),
        };
        answers.push(a);
    }
    let asked: Vec<(usize, (String, String))> = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((i, (items[i].instance_id.clone(), a.as_ref().ok()?.patch.clone()?))))
        .collect();
    let pairs: Vec<(String, String)> = asked.iter().map(|(_, p)| p.clone()).collect();
    let mut outcomes = vec![None; items.len()];
    if mode.runs_tests() {
        for ((i, _), o) in asked.iter().zip(svc.grader.outcomes(&pairs)) {
            outcomes[*i] = Some(o);
        }
    }
    answers
        .iter()
        .zip(&outcomes)
        .map(|(a, o)| match a {
            Err(e) => json!({"reward": null, "error": e}),
            Ok(a) => {
                let reward = a.reward(mode, o.as_ref());
                json!({
                    "reward": reward,
                    "reward_similarity": a.reward_similarity,
                    "reward_tests": a.reward(Mode::Tests, o.as_ref()),
                    "reward_hybrid": a.reward(Mode::Hybrid, o.as_ref()),
                    "resolved": o.as_ref().filter(|o| o.graded()).map(|o| o.resolved),
                    "f2p_passed": o.as_ref().map(|o| o.f2p_passed),
                    "f2p_total": o.as_ref().map(|o| o.f2p_total),
                    "p2p_passed": o.as_ref().map(|o| o.p2p_passed),
                    "p2p_total": o.as_ref().map(|o| o.p2p_total),
                    "status": o.as_ref().map(|o| o.status.clone()),
                    "reason": o.as_ref().map(|o| o.reason.clone()),
                    "seconds": o.as_ref().map(|o| o.seconds),
                    "format_error": a.format_error,
                    "error": if reward.is_none() { o.as_ref().map(|o| o.reason.clone()) } else { None },
                })
            }
        })
        .collect()
}

/// A patch sent as is: graded as given; its similarity is the reference's unidiff reward
/// against the oracle when the instance's files are known.
fn raw_patch(
    p: &str,
    context: &crate::reward::rollouts::Files,
    oracle: &crate::reward::rollouts::Files,
) -> modes::Answer {
    let similarity = if oracle.is_empty() {
        0.0
    } else {
        crate::reward::unidiff_reward(&[modes::git_diff(context, oracle)], &[p.to_string()]).reward
    };
    modes::Answer {
        reward_similarity: -1.0,
        format_error: Some("a patch, not a SWE-RL answer".into()),
        patch: Some(p.to_string()),
        similarity,
    }
}
