//! Ranker weights learned from the lake's own PRs. A merged PR's changed files are free
//! labels: hide one, and the ranker should put it above the files the PR left alone. The
//! weights minimise a pairwise logistic loss (the hidden file against the unchanged files that
//! currently outrank it or come close: the top of the list is what a prompt shows), fitted
//! by Newton's method — fifteen weights, a few seconds of arithmetic at most.

// Small dense linear algebra reads best with indices, as in the textbooks it comes from.
#![allow(clippy::needless_range_loop)]

use super::rank::{Model, EMBEDDING, NF};

/// One leave-one-out case as the learner sees it: the scaled features of its candidates and
/// which of them the PR changed.
#[derive(Debug, Clone)]
pub struct Example {
    pub x: Vec<[f64; NF]>,
    pub target: usize,
}

/// Unchanged files per case that the loss pairs with the hidden one.
const HARD_NEGATIVES: usize = 40;
/// L2 penalty (per case) toward the starting weights: keeps weights finite when a feature
/// separates perfectly, and a fit on few cases close to the weights it started from.
const L2: f64 = 0.01;
const ROUNDS: usize = 3;
const NEWTON_STEPS: usize = 12;

fn solve(mut a: [[f64; NF]; NF], mut b: [f64; NF]) -> Option<[f64; NF]> {
    for col in 0..NF {
        let piv = (col..NF).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for r in 0..NF {
            if r != col {
                let f = a[r][col] / a[col][col];
                if f != 0.0 {
                    for c in col..NF {
                        a[r][c] -= f * a[col][c];
                    }
                    b[r] -= f * b[col];
                }
            }
        }
    }
    let mut x = [0.0; NF];
    for i in 0..NF {
        x[i] = b[i] / a[i][i];
    }
    Some(x)
}

/// Weights fitted on `examples`, starting from `start`. `use_embedding` false fits the
/// cheap first stage (its embedding weight stays 0).
pub fn fit(examples: &[Example], use_embedding: bool, start: &Model) -> Model {
    let active: Vec<bool> = (0..NF).map(|j| use_embedding || j != EMBEDDING).collect();
    let mut start = start.clone();
    if !use_embedding {
        start.weights[EMBEDDING] = 0.0;
    }
    fit_active(examples, &active, &start)
}

/// The embedding's weight alone, fitted on the re-ranked `examples`, every other weight kept
/// at `start`'s (the first stage's): the second stage adds the encoder's opinion to the first
/// stage's score instead of refitting every weight on the few re-ranked candidates, which
/// overfits them (pallets/jinja recall@10: 0.812 refitting all of them, 0.823 adding).
pub fn fit_embedding(examples: &[Example], start: &Model) -> Model {
    let active: Vec<bool> = (0..NF).map(|j| j == EMBEDDING).collect();
    fit_active(examples, &active, start)
}

fn fit_active(examples: &[Example], active: &[bool], start: &Model) -> Model {
    let mut w = start.weights;
    let prior = w;
    let usable: Vec<&Example> = examples.iter().filter(|e| e.target < e.x.len() && e.x.len() > 1).collect();
    if usable.is_empty() {
        return start.clone();
    }
    for _ in 0..ROUNDS {
        // Pairs (hidden minus unchanged) for the current weights' hardest negatives.
        let mut pairs: Vec<([f64; NF], f64)> = Vec::new();
        for e in &usable {
            let score = |x: &[f64; NF]| (0..NF).map(|j| w[j] * x[j]).sum::<f64>();
            let mut neg: Vec<(f64, usize)> =
                (0..e.x.len()).filter(|&i| i != e.target).map(|i| (score(&e.x[i]), i)).collect();
            neg.sort_by(|a, b| b.0.total_cmp(&a.0));
            neg.truncate(HARD_NEGATIVES);
            let weight = 1.0 / neg.len().max(1) as f64;
            for (_, i) in neg {
                let mut d = [0.0; NF];
                for j in 0..NF {
                    d[j] = if active[j] { e.x[e.target][j] - e.x[i][j] } else { 0.0 };
                }
                pairs.push((d, weight));
            }
        }
        let n = usable.len() as f64;
        for _ in 0..NEWTON_STEPS {
            let mut grad = [0.0; NF];
            let mut hess = [[0.0; NF]; NF];
            for (d, pw) in &pairs {
                let m: f64 = (0..NF).map(|j| w[j] * d[j]).sum();
                let p = 1.0 / (1.0 + m.exp()); // sigmoid(-m): the pair's error
                let h = p * (1.0 - p);
                for j in 0..NF {
                    grad[j] -= pw * p * d[j];
                    for k in 0..NF {
                        hess[j][k] += pw * h * d[j] * d[k];
                    }
                }
            }
            for j in 0..NF {
                if active[j] {
                    grad[j] = grad[j] / n + L2 * (w[j] - prior[j]);
                    for k in 0..NF {
                        hess[j][k] /= n;
                    }
                    hess[j][j] += L2;
                } else {
                    // Frozen: a unit row keeps the system solvable and the step zero.
                    grad[j] = 0.0;
                    hess[j] = [0.0; NF];
                    hess[j][j] = 1.0;
                }
            }
            let Some(step) = solve(hess, grad) else { break };
            let mut moved = 0.0f64;
            for j in 0..NF {
                w[j] -= step[j];
                moved = moved.max(step[j].abs());
            }
            if moved < 1e-6 {
                break;
            }
        }
    }
    Model { weights: w, fitted_on: usable.len() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases where feature 3 marks the changed file and feature 0 is noise: the fit must
    /// put its weight on 3 and rank the targets first.
    #[test]
    fn learns_the_feature_that_marks_the_changed_file() {
        let mut rng = 7u64;
        let mut next = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let examples: Vec<Example> = (0..60)
            .map(|c| {
                let x: Vec<[f64; NF]> = (0..20)
                    .map(|i| {
                        let mut v = [0.0; NF];
                        v[0] = next();
                        v[3] = if i == c % 20 { 0.6 + 0.4 * next() } else { 0.5 * next() };
                        v
                    })
                    .collect();
                Example { x, target: c % 20 }
            })
            .collect();
        let start = Model {
            weights: {
                let mut w = [0.0; NF];
                w[0] = 1.0;
                w
            },
            fitted_on: 0,
        };
        let m = fit(&examples, false, &start);
        assert_eq!(m.fitted_on, 60);
        assert!(m.weights[3] > 5.0 * m.weights[0].abs(), "{:?}", m.weights);
        assert_eq!(m.weights[EMBEDDING], 0.0);
        let top1 = examples
            .iter()
            .filter(|e| {
                let s: Vec<f64> = e.x.iter().map(|x| m.score(x, false)).collect();
                (0..s.len()).all(|i| i == e.target || s[i] < s[e.target])
            })
            .count();
        assert!(top1 >= 55, "{top1} of 60 first");
    }
}
