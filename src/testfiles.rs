//! Which files are tests, in one table (ripgrep's `default_types.rs` is the shape): SWE-bench's
//! rule for what a PR's test changes are, the directories that hold tests (relevance ranking),
//! and per toolchain of the verify stage, which of those files its runner can be pointed at.
//! A file's language comes from `lang::language`, the one table of extensions.

/// A toolchain's test files.
#[derive(Debug)]
pub struct Rule {
    /// The verify toolchain's name.
    pub toolchain: &'static str,
    /// The languages (`lang::language`) of files its runner takes.
    pub languages: &'static [&'static str],
    /// File names that hold fixtures or set-up, not tests.
    pub never_named: &'static [&'static str],
    /// Endings of files that are declarations or data, not tests.
    pub never_ending: &'static [&'static str],
    /// Directories whose files are fixtures, mocks or snapshots.
    pub helper_dirs: &'static [&'static str],
}

/// The table. A module of any name under a test path is a test module: named on the command
/// line, pytest collects `jinja2/testsuite/core_tags.py` as it does `test_*.py`.
pub static RULES: &[Rule] = &[
    Rule {
        toolchain: "python",
        languages: &["Python"],
        never_named: &["conftest.py", "__init__.py"],
        never_ending: &[".pyi", ".pyx", ".pxd"],
        helper_dirs: &[],
    },
    Rule {
        toolchain: "javascript",
        languages: &["JavaScript", "TypeScript"],
        never_named: &[],
        never_ending: &[".d.ts", ".d.mts", ".d.cts"],
        helper_dirs: &["fixtures/", "__fixtures__/", "__mocks__/", "__snapshots__/", "node_modules/"],
    },
    Rule {
        toolchain: "rust",
        languages: &["Rust"],
        never_named: &["build.rs"],
        never_ending: &[],
        // trybuild's and insta's inputs are compiled or compared by a test, not tests.
        helper_dirs: &["fixtures/", "snapshots/", "target/"],
    },
];

/// Directory names that hold tests.
pub const TEST_DIRS: &[&str] = &["test", "tests", "testing", "testsuite", "__tests__", "spec"];

/// SWE-bench's rule for test files (`swebench.collect.utils.extract_patches`): the path
/// contains `test` (so also `tests`, `testing`) or `e2e`.
pub fn is_test_path(path: &str) -> bool {
    path.contains("test") || path.contains("e2e")
}

/// Whether a directory of `path` is one that holds tests.
pub fn in_test_dir(path: &str) -> bool {
    path.split('/').any(|seg| TEST_DIRS.contains(&seg))
}

/// Whether a test path by SWE-bench's rule is a test: code, or a file in a test directory
/// (its data, its snapshots). `.github/workflows/tests.yaml` and `requirements/tests.txt`
/// have `test` in their paths and are neither.
pub fn is_test_change(path: &str) -> bool {
    is_test_path(path) && (crate::lang::language(path).is_some() || in_test_dir(path))
}

/// Whether `path`, a test path by SWE-bench's rule, is a file `toolchain`'s runner takes.
pub fn runnable(toolchain: &str, path: &str) -> bool {
    let Some(rule) = RULES.iter().find(|r| r.toolchain == toolchain) else { return false };
    let name = path.rsplit('/').next().unwrap_or(path);
    crate::lang::language(path).is_some_and(|l| rule.languages.contains(&l))
        && !rule.never_named.contains(&name)
        && !rule.never_ending.iter().any(|e| name.ends_with(e))
        && !rule.helper_dirs.iter().any(|h| path.contains(h))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ci_workflows_and_requirement_lists_are_not_test_changes() {
        for p in ["tests/test_jws.py", "tests/conftest.py", "tests/res/expected.json", "src/testing.py", "e2e/app.ts"] {
            assert!(super::is_test_change(p), "{p}");
        }
        for p in [".github/workflows/tests.yaml", "requirements/tests.txt", "test-requirements.txt", "pytest.ini"] {
            assert!(!super::is_test_change(p), "{p}");
        }
    }

    use super::*;

    #[test]
    fn each_toolchain_takes_its_own_test_files() {
        assert!(runnable("python", "tests/test_api.py") && runnable("python", "pkg/api_test.py"));
        assert!(!runnable("python", "tests/conftest.py") && !runnable("python", "tests/res/test.txt"));
        assert!(runnable("javascript", "test/calc.test.js") && runnable("javascript", "src/__tests__/a.spec.tsx"));
        assert!(runnable("javascript", "test/a.mjs") && runnable("javascript", "test/b.cts"));
        assert!(
            !runnable("javascript", "test/fixtures/broken.js")
                && !runnable("javascript", "test/__snapshots__/a.js.snap")
        );
        assert!(!runnable("javascript", "types/index.d.ts") && !runnable("javascript", "test/data.json"));
        assert!(runnable("rust", "tests/it/main.rs") && runnable("rust", "src/parser/tests.rs"));
        assert!(!runnable("rust", "tests/fixtures/bad.rs") && !runnable("go", "x_test.go"));
        assert!(in_test_dir("src/__tests__/a.js") && !in_test_dir("src/testing_utils.py"));
    }
}
