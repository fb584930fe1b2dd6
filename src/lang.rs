//! Programming language of a path, from its extension or well-known file name. Used to tell
//! code changes from the rest (docs, lock files, data) when curating PRs.

/// The language of `path`, or `None` for files that are not source code.
pub fn language(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name {
        "Makefile" | "makefile" | "GNUmakefile" => return Some("Makefile"),
        "Dockerfile" => return Some("Dockerfile"),
        "CMakeLists.txt" => return Some("CMake"),
        _ => {}
    }
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
    Some(match ext.as_str() {
        "py" | "pyi" | "pyx" | "pxd" => "Python",
        "rs" => "Rust",
        "go" => "Go",
        "java" => "Java",
        "kt" | "kts" => "Kotlin",
        "scala" | "sc" => "Scala",
        "js" | "mjs" | "cjs" | "jsx" => "JavaScript",
        "ts" | "tsx" | "mts" | "cts" => "TypeScript",
        "c" | "h" => "C",
        "cc" | "cpp" | "cxx" | "hpp" | "hh" | "hxx" => "C++",
        "cs" => "C#",
        "rb" => "Ruby",
        "php" => "PHP",
        "swift" => "Swift",
        "m" | "mm" => "Objective-C",
        "sh" | "bash" | "zsh" => "Shell",
        "ps1" => "PowerShell",
        "pl" | "pm" => "Perl",
        "r" => "R",
        "jl" => "Julia",
        "lua" => "Lua",
        "dart" => "Dart",
        "ex" | "exs" => "Elixir",
        "erl" | "hrl" => "Erlang",
        "hs" => "Haskell",
        "ml" | "mli" => "OCaml",
        "clj" | "cljs" => "Clojure",
        "elm" => "Elm",
        "vue" => "Vue",
        "svelte" => "Svelte",
        "sql" => "SQL",
        "zig" => "Zig",
        "nim" => "Nim",
        "f90" | "f95" | "f03" | "f" => "Fortran",
        "sol" => "Solidity",
        "groovy" | "gradle" => "Groovy",
        "cu" | "cuh" => "CUDA",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::language;

    #[test]
    fn languages() {
        assert_eq!(language("calc/ops.py"), Some("Python"));
        assert_eq!(language("src/LIB.RS"), Some("Rust"));
        assert_eq!(language("web/app.tsx"), Some("TypeScript"));
        assert_eq!(language("build/Makefile"), Some("Makefile"));
        assert_eq!(language("README.md"), None);
        assert_eq!(language("Cargo.lock"), None);
        assert_eq!(language("logo.png"), None);
        assert_eq!(language("noext"), None);
    }
}
