"""Internals of :mod:`kvcompat.scan` (import from there; these modules may change).

``_rules``: codes, messages and :class:`~kvcompat.scan.Finding`. ``_source``: ast
positions as text offsets, suppression comments. ``_analysis``: the guard rules.
``_fix``: scanning and rewriting one module. ``_run``: files, reports, the CLI.
Standard library only: the scanner never imports torch or an engine.
"""
