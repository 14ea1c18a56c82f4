"""What the tests and the benchmarks share: the tools that start a stack and those that break it.

``reminder_pipeline_tests`` and ``benchmarks`` both import this package and never each other; it
imports neither of them (the import contract in ``pyproject.toml`` holds all three, and
``reminder_pipeline`` imports none). Like them it runs from the repository's root and ships in no
wheel. One module per tool; docs/testing.md lists them.
"""
