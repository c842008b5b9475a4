"""Reports: a pair run as terminal text or JSON (text), one session as a self-contained
Markdown, HTML or JSON document (export), a suite's four report files (suite), and the
inline SVG charts they embed (svg), all built on one set of escaping and table helpers
(_markup)."""
