//! Imports resolved to paths: which files of the repository a file imports, for Python,
//! JavaScript/TypeScript, Rust, Go and Java/Kotlin. A stem match (`import ops` ~ any `ops.*`)
//! lights up every `utils.py` of a large repository; resolving the import against the tree
//! picks the one file it means.
//!
//! Resolution is by path: an import becomes a set of *targets* — exact paths (relative
//! imports), path suffixes (`werkzeug/routing/map.py` for `werkzeug.routing.map`, under
//! whatever source root) or directory suffixes (a Go package) — and a file is imported when
//! one of them matches it.

use std::collections::HashMap;

/// Where an import may point.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// This exact path (relative imports, resolved against the importing file).
    Exact(String),
    /// Any path that is this or ends with `/` + this.
    Suffix(String),
    /// Any file directly inside a directory that is this or ends with `/` + this.
    Dir(String),
}

fn join(dir: &str, rel: &str) -> Option<String> {
    let mut parts: Vec<&str> = if dir.is_empty() { Vec::new() } else { dir.split('/').collect() };
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).unwrap_or(s.len());
    &s[..end]
}

fn python(path: &str, content: &str, out: &mut Vec<Target>) {
    let module_targets = |m: &str, out: &mut Vec<Target>| {
        // `from . import x` and `from .m import y` are relative to the importing package.
        let dots = m.chars().take_while(|&c| c == '.').count();
        let rest = &m[dots..];
        let rel = rest.replace('.', "/");
        if dots > 0 {
            let mut base = parent(path).to_string();
            for _ in 1..dots {
                base = parent(&base).to_string();
            }
            let p =
                if rel.is_empty() { base.clone() } else { format!("{base}/{rel}").trim_start_matches('/').to_string() };
            out.push(Target::Exact(format!("{p}.py")));
            out.push(Target::Exact(format!("{}/__init__.py", p).trim_start_matches('/').to_string()));
        } else if !rel.is_empty() {
            out.push(Target::Suffix(format!("{rel}.py")));
            out.push(Target::Suffix(format!("{rel}/__init__.py")));
        }
    };
    for line in content.lines().take(2000) {
        let l = line.trim_start();
        if let Some(r) = l.strip_prefix("import ") {
            for m in r.split(',') {
                let m = ident(m.trim());
                if !m.is_empty() {
                    module_targets(m, out);
                }
            }
        } else if let Some(r) = l.strip_prefix("from ") {
            let mut it = r.splitn(2, " import ");
            let module = ident(it.next().unwrap_or("").trim());
            if module.is_empty() {
                continue;
            }
            module_targets(module, out);
            // `from pkg import sub` may name a submodule.
            if let Some(names) = it.next() {
                for n in names.trim_matches(|c| c == '(' || c == ')' || c == ' ').split(',') {
                    let n = ident(n.trim());
                    if !n.is_empty() && !n.contains('.') {
                        let sep = if module.ends_with('.') { "" } else { "." };
                        module_targets(&format!("{module}{sep}{n}"), out);
                    }
                }
            }
        }
    }
}

fn quoted(l: &str) -> Option<&str> {
    let i = l.find(['\'', '"'])?;
    let q = &l[i..i + 1];
    let rest = &l[i + 1..];
    rest.find(q).map(|j| &rest[..j])
}

fn javascript(path: &str, content: &str, out: &mut Vec<Target>) {
    for line in content.lines().take(2000) {
        let l = line.trim_start();
        let spec = if let Some(i) = l.find("require(").or_else(|| l.find("import(")) {
            quoted(&l[i..])
        } else if l.starts_with("import ") || l.starts_with("export ") {
            l.find(" from ").and_then(|i| quoted(&l[i..])).or_else(|| l.strip_prefix("import ").and_then(quoted))
        } else if l.starts_with("} from ") {
            quoted(l)
        } else {
            None
        };
        let Some(spec) = spec else { continue };
        if !spec.starts_with('.') {
            continue; // a package, not a file of this repository
        }
        let Some(p) = join(parent(path), spec) else { continue };
        out.push(Target::Exact(p.clone()));
        for ext in [".js", ".ts", ".tsx", ".jsx", ".mjs", ".cjs", "/index.js", "/index.ts", "/index.tsx"] {
            out.push(Target::Exact(format!("{p}{ext}")));
        }
        // TypeScript imports compiled names: `./x.js` is `./x.ts` in the tree.
        if let Some(stem) = p.strip_suffix(".js") {
            out.push(Target::Exact(format!("{stem}.ts")));
            out.push(Target::Exact(format!("{stem}.tsx")));
        }
    }
}

fn rust(path: &str, content: &str, out: &mut Vec<Target>) {
    let dir = parent(path);
    let file = path.rsplit('/').next().unwrap_or(path);
    // A module's children live next to mod.rs/lib.rs/main.rs, else in a directory named after it.
    let module_dir = if matches!(file, "mod.rs" | "lib.rs" | "main.rs") {
        dir.to_string()
    } else {
        format!("{dir}/{}", file.trim_end_matches(".rs")).trim_start_matches('/').to_string()
    };
    for line in content.lines().take(2000) {
        let l = line.trim_start().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
        if let Some(r) = l.strip_prefix("mod ") {
            let name = ident(r.trim());
            if !name.is_empty() && r.trim_end().ends_with(';') {
                out.push(Target::Exact(format!("{module_dir}/{name}.rs").trim_start_matches('/').to_string()));
                out.push(Target::Exact(format!("{module_dir}/{name}/mod.rs").trim_start_matches('/').to_string()));
            }
        } else if let Some(r) = l.strip_prefix("use ") {
            let spec: String = r.chars().take_while(|&c| c.is_alphanumeric() || c == '_' || c == ':').collect();
            let segs: Vec<&str> = spec.split("::").filter(|s| !s.is_empty()).collect();
            let supers = segs.iter().take_while(|s| **s == "super").count();
            let (base, rest): (Option<String>, &[&str]) = match segs.first() {
                Some(&"crate") => (None, &segs[1..]),
                Some(&"super") => {
                    let mut b = module_dir.clone();
                    for _ in 0..supers {
                        b = parent(&b).to_string();
                    }
                    (Some(b), &segs[supers..])
                }
                Some(&"self") => (Some(module_dir.clone()), &segs[1..]),
                _ => continue, // another crate
            };
            // The path names modules then maybe an item: try every prefix as a module file.
            for n in 1..=rest.len() {
                let rel = rest[..n].join("/");
                match &base {
                    Some(b) => {
                        out.push(Target::Exact(format!("{b}/{rel}.rs").trim_start_matches('/').to_string()));
                        out.push(Target::Exact(format!("{b}/{rel}/mod.rs").trim_start_matches('/').to_string()));
                    }
                    None => {
                        out.push(Target::Suffix(format!("src/{rel}.rs")));
                        out.push(Target::Suffix(format!("src/{rel}/mod.rs")));
                    }
                }
            }
        }
    }
}

fn go(content: &str, out: &mut Vec<Target>) {
    let mut in_block = false;
    for line in content.lines().take(2000) {
        let l = line.trim();
        let spec = if in_block {
            if l.starts_with(')') {
                in_block = false;
                continue;
            }
            quoted(l)
        } else if l.starts_with("import (") {
            in_block = true;
            continue;
        } else if l.starts_with("import ") {
            quoted(l)
        } else {
            None
        };
        // Module paths start with the host (`github.com/o/r/pkg/x`): the last two segments
        // name the package's directory under any checkout root.
        if let Some(spec) = spec.filter(|s| s.contains('/')) {
            let segs: Vec<&str> = spec.split('/').collect();
            let tail = segs[segs.len().saturating_sub(2)..].join("/");
            out.push(Target::Dir(tail));
        }
    }
}

fn java(content: &str, ext: &str, out: &mut Vec<Target>) {
    for line in content.lines().take(2000) {
        let Some(r) = line.trim_start().strip_prefix("import ") else { continue };
        let r = r.trim_start_matches("static ").trim().trim_end_matches(';').trim();
        if let Some(pkg) = r.strip_suffix(".*") {
            out.push(Target::Dir(pkg.replace('.', "/")));
        } else {
            let p = r.replace('.', "/");
            out.push(Target::Suffix(format!("{p}.{ext}")));
            // `import static a.B.member`: the class is one segment up.
            if let Some((cls, _)) = p.rsplit_once('/') {
                out.push(Target::Suffix(format!("{cls}.{ext}")));
            }
        }
    }
}

/// What `path` (with `content`) imports, as targets to match against the repository's paths.
pub fn targets(path: &str, content: &str) -> Vec<Target> {
    let mut out = Vec::new();
    let ext = path.rsplit_once('.').map_or("", |(_, e)| e);
    match ext {
        "py" | "pyi" => python(path, content, &mut out),
        "js" | "jsx" | "ts" | "tsx" | "mjs" | "cjs" | "vue" | "svelte" => javascript(path, content, &mut out),
        "rs" => rust(path, content, &mut out),
        "go" => go(content, &mut out),
        "java" | "kt" | "scala" => java(content, ext, &mut out),
        _ => {}
    }
    out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    out.dedup();
    out
}

/// The paths of a tree, indexed for matching import targets.
pub struct PathIndex<'a> {
    by_name: HashMap<&'a str, Vec<&'a str>>,
    by_dir: HashMap<&'a str, Vec<&'a str>>,
}

impl<'a> PathIndex<'a> {
    pub fn new(paths: impl IntoIterator<Item = &'a str>) -> PathIndex<'a> {
        let mut by_name: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut by_dir: HashMap<&str, Vec<&str>> = HashMap::new();
        for p in paths {
            by_name.entry(p.rsplit('/').next().unwrap_or(p)).or_default().push(p);
            by_dir.entry(parent(p)).or_default().push(p);
        }
        PathIndex { by_name, by_dir }
    }

    /// The paths `t` points at.
    pub fn resolve(&self, t: &Target) -> Vec<&'a str> {
        let ends = |p: &str, s: &str| {
            p == s || (p.len() > s.len() && p.ends_with(s) && p.as_bytes()[p.len() - s.len() - 1] == b'/')
        };
        match t {
            Target::Exact(p) | Target::Suffix(p) => {
                let name = p.rsplit('/').next().unwrap_or(p);
                let exact = matches!(t, Target::Exact(_));
                self.by_name
                    .get(name)
                    .map(|v| v.iter().copied().filter(|c| if exact { c == p } else { ends(c, p) }).collect())
                    .unwrap_or_default()
            }
            Target::Dir(d) => {
                self.by_dir.iter().filter(|(k, _)| ends(k, d)).flat_map(|(_, v)| v.iter().copied()).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(path: &str, content: &str, tree: &[&str]) -> Vec<String> {
        let idx = PathIndex::new(tree.iter().copied());
        let mut v: Vec<String> = targets(path, content).iter().flat_map(|t| idx.resolve(t)).map(String::from).collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn python_absolute_relative_and_submodule_imports() {
        let tree = [
            "src/werkzeug/routing/__init__.py",
            "src/werkzeug/routing/map.py",
            "src/werkzeug/routing/rules.py",
            "src/werkzeug/utils.py",
            "src/werkzeug/wrappers/request.py",
            "tests/utils.py",
        ];
        let src = "import os\nfrom werkzeug.utils import cached_property\nfrom .rules import Rule\nfrom .. import wrappers\nfrom ..wrappers import request\n";
        assert_eq!(
            resolved("src/werkzeug/routing/map.py", src, &tree),
            vec!["src/werkzeug/routing/rules.py", "src/werkzeug/utils.py", "src/werkzeug/wrappers/request.py"]
        );
        // `import werkzeug.routing` is the package's __init__, not every routing file.
        assert_eq!(
            resolved("tests/t.py", "import werkzeug.routing\n", &tree),
            vec!["src/werkzeug/routing/__init__.py"]
        );
    }

    #[test]
    fn javascript_rust_go_java_imports() {
        let tree = ["web/src/util/strings.ts", "web/src/format.js", "web/src/app.ts"];
        let js =
            "import { pad } from './util/strings';\nconst f = require(\"./format\");\nimport React from 'react';\n";
        assert_eq!(resolved("web/src/app.ts", js, &tree), vec!["web/src/format.js", "web/src/util/strings.ts"]);

        let tree = ["src/lexer.rs", "src/parser/mod.rs", "src/parser/expr.rs", "src/main.rs"];
        let rs = "mod lexer;\nuse crate::parser::expr::Expr;\nuse std::fmt;\n";
        assert_eq!(resolved("src/main.rs", rs, &tree), vec!["src/lexer.rs", "src/parser/expr.rs", "src/parser/mod.rs"]);
        assert_eq!(resolved("src/parser/expr.rs", "use super::super::lexer::Token;\n", &tree), vec!["src/lexer.rs"]);
        assert_eq!(resolved("src/parser/mod.rs", "mod expr;\n", &tree), vec!["src/parser/expr.rs"]);

        let tree = ["pkg/store/db.go", "pkg/store/cache.go", "cmd/main.go"];
        let goimp = "import (\n\t\"fmt\"\n\t\"github.com/o/r/pkg/store\"\n)\n";
        assert_eq!(resolved("cmd/main.go", goimp, &tree), vec!["pkg/store/cache.go", "pkg/store/db.go"]);

        let tree = ["src/main/java/com/x/Foo.java", "src/main/java/com/x/Bar.java"];
        assert_eq!(
            resolved("src/main/java/com/x/Baz.java", "import com.x.Foo;\nimport java.util.List;\n", &tree),
            vec!["src/main/java/com/x/Foo.java"]
        );
    }
}
