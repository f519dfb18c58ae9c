#!/usr/bin/env python3
"""Tests of .ci/imports.py on small crates written to a temporary folder."""

import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import imports  # noqa: E402


def crate(files):
    tmp = tempfile.TemporaryDirectory()
    src = pathlib.Path(tmp.name) / "src"
    for path, text in files.items():
        f = src / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text, encoding="utf-8")
    return tmp, src


def fn_of(lines, name="long"):
    body = "".join(f"    let x{k} = {k};\n" for k in range(lines - 2))
    return f"fn {name}() {{\n{body}}}\n"


class Checks(unittest.TestCase):
    def found(self, files):
        tmp, src = crate(files)
        with tmp:
            return imports.violations(src)

    def test_a_long_file_and_a_long_function(self):
        found = self.found({
            "lib.rs": "pub mod api;\n",
            "api/mod.rs": fn_of(imports.MAX_FN_LINES + 1) + fn_of(imports.MAX_FN_LINES, "ok")
            + "\n" * imports.MAX_FILE_LINES,
        })
        self.assertEqual(found.get("src/api/mod.rs::long"), imports.MAX_FN_LINES + 1)
        self.assertNotIn("src/api/mod.rs::ok", found)
        self.assertGreater(found.get("src/api/mod.rs", 0), imports.MAX_FILE_LINES)

    def test_braces_in_strings_comments_and_chars_do_not_count(self):
        text = (
            "fn f() {\n"
            '    let s = "}}}";\n'
            "    let c = '}';\n"
            "    // }\n"
            "    /* } /* nested } */ } */\n"
            '    let r = r#"}"#;\n'
            "    let l: &'static str = \"\";\n"
            + "".join("    g();\n" for _ in range(imports.MAX_FN_LINES))
            + "}\n"
        )
        found = self.found({"lib.rs": "pub mod api;\n", "api/mod.rs": text})
        self.assertEqual(found.get("src/api/mod.rs::f"), imports.MAX_FN_LINES + 8)

    def test_an_import_from_a_lower_layer_to_a_higher_one(self):
        found = self.found({
            "lib.rs": "pub mod api;\npub mod estimate;\n",
            "api/mod.rs": "pub mod validate;\n",
            "api/validate.rs": "use crate::{estimate::arch::Arch, api::Job};\n"
            "fn f() { crate::estimate::go(); }\n",
            "estimate/mod.rs": "pub mod arch;\nuse crate::api::Job;\n",
            "estimate/arch.rs": "pub struct Arch;\n",
        })
        self.assertEqual(found, {"src/api/validate.rs -> estimate": 2})

    def test_test_code_is_left_out_of_the_layers(self):
        found = self.found({
            "lib.rs": "pub mod api;\npub mod estimate;\n",
            "api/mod.rs": "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline {\n"
            "    use crate::estimate::go;\n}\n",
            "api/tests.rs": "use crate::estimate::go;\n",
            "estimate/mod.rs": "pub fn go() {}\n",
        })
        self.assertEqual(found, {})

    def test_a_file_circle_but_not_parent_and_child(self):
        found = self.found({
            "lib.rs": "pub mod plan;\n",
            "plan/mod.rs": "mod advice;\nmod shrink;\npub use shrink::cheapest;\n",
            "plan/advice.rs": "use super::shrink::cheapest;\nuse super::Settings;\n",
            "plan/shrink.rs": "pub fn cheapest() { super::advice::advise(); }\n",
        })
        self.assertEqual(found, {"src/plan/advice.rs <-> src/plan/shrink.rs": 1})

    def test_known_offenders_may_not_grow_and_the_list_only_shrinks(self):
        known = {"src/a.rs": 900, "src/b.rs::f": 130, "src/c.rs": 850}
        found = {"src/a.rs": 901, "src/b.rs::f": 125, "src/d.rs -> cli": 1}
        failures, left = imports.compare(found, known)
        text = "\n".join(failures)
        self.assertIn("grew: src/a.rs", text)
        self.assertIn("shrank: src/b.rs::f 130 -> 125", text)
        self.assertIn("new: src/d.rs -> cli", text)
        self.assertIn("fixed: src/c.rs", text)
        self.assertEqual(imports.compare(known, known), ([], [
            f"src/a.rs (file over {imports.MAX_FILE_LINES} lines, 900)",
            f"src/b.rs::f (function over {imports.MAX_FN_LINES} lines, 130)",
            f"src/c.rs (file over {imports.MAX_FILE_LINES} lines, 850)",
        ]))

    def test_the_layers_name_every_top_module_of_the_crate(self):
        src = pathlib.Path(__file__).resolve().parent.parent / "src"
        tops = {p.stem for p in src.glob("*.rs")} | {p.name for p in src.iterdir() if p.is_dir()}
        named = {m for layer in imports.LAYERS for m in layer}
        self.assertEqual(tops - named - {"lib", "main", "kubectl_main"}, set())


if __name__ == "__main__":
    unittest.main()
