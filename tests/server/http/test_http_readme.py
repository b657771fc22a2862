"""The README's HTTP examples, run as written (curl and redis-cli) against
a server on the manual clock, output compared line by line."""

from __future__ import annotations

from http_calls import http_examples, run_examples


def test_the_readme_examples_answer_as_shown(hs):
    examples = http_examples()
    assert len(examples) >= 5 and any("curl" in cmd for cmd, _ in examples)
    run_examples(hs, examples)
