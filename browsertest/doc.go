// Package browsertest loads sluice's status page (package sluicestatus) in
// headless Chromium, driven by chromedp, against a live Transport under
// load. It is a module of its own so that chromedp stays out of the
// library's go.mod.
//
// The browser is Debian's chromium-headless-shell, or the binary named by
// SLUICE_CHROME. Without one the test skips, unless SLUICE_REQUIRE_BROWSER=1
// (set by .ci/run), when it fails. On failure it writes a screenshot to
// SLUICE_SCREENSHOT_DIR (default: the system's temporary directory) and
// logs where. SLUICE_STATUS_PNG=path makes it run the load for
// SLUICE_STATUS_SECONDS (default 90) and write the page's screenshot there:
// that is how docs/status.png is made.
package browsertest
