// Package e2e tests computeql's browser pages in a real headless Chromium, driven by chromedp,
// against the whole system in one process: the HTTP API, the feed, a worker and the simulated
// region, on a real redis-server that the package starts itself.
//
// The tests need Chromium (Debian's chromium package; COMPUTEQL_CHROMIUM names another binary).
// Without it they skip, except under CI (CI set), where a missing browser fails them: CI
// installs it, and a skipped browser test must not pass for a run of the browser tests.
// Screenshots are written to the directory COMPUTEQL_ARTIFACTS names (the Makefile sets
// artifacts/ at the top of the repository), else to a temporary directory, and the tests log
// where.
package e2e
