"""The dashboard's style and script (server/views/dashboard_html.py renders the page).

The script is an addition: the page as served is whole without it. With it:

- ``<main>`` is replaced by each fragment /dashboard/events sends; the server also sends a
  ``beat`` event every ``data-beat`` seconds while nothing changes, so a page that heard
  nothing for three beats (the box stopped, hung, or the network cut) shows its
  "disconnected" banner and connects again, and hides it once the stream answers;
- countdowns tick locally, each second, from the times the server rendered (the box's own
  clock: ``data-now`` on ``<main>`` corrects for the browser's): "loading for", "gives up
  in", idle times and the uptime;
- the buttons (rendered for an admin only) POST /v1/operator/{action} with the session's
  CSRF token (``<meta name=csrf-token>``) in X-CSRF-Token, and say what the box answered.
"""

from __future__ import annotations

STYLE = (
    "body{font:14px system-ui,sans-serif;margin:1.2em;color:#222}h1{font-size:1.3em}"
    "h2{font-size:1.05em;margin:1.2em 0 .4em}table{border-collapse:collapse}"
    "td,th{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:left;white-space:nowrap}"
    ".num{text-align:right}.error{color:#a00}.bar{display:flex;width:40em;max-width:95vw;"
    "height:1.4em;background:#eee;border:1px solid #bbb}.seg{background:#4a8;color:#fff;"
    "overflow:hidden;white-space:nowrap;font-size:.8em;padding:0 .3em;border-right:1px solid"
    " #fff}.seg.starting{background:repeating-linear-gradient(45deg,#e96,#e96 6px,#eb8 6px,"
    "#eb8 12px);color:#000}.seg.stopping{background:#999}.muted{color:#777}"
    "#disconnected{position:sticky;top:0;background:#a00;color:#fff;padding:.4em .8em;"
    "font-weight:bold}#disconnected a{color:#fff}pre.log{font-size:.8em;background:#f6f6f6;"
    "padding:.4em;margin:.2em 0;"
    "max-width:95vw;overflow:auto}td button{font-size:.85em}form.inline{display:inline}"
    "#action-result{min-height:1.2em}"
)
SCRIPT = """
const body = document.body;
const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
const beat = Number(body.dataset.beat || 5) * 1000;
let events = null, heard = Date.now(), skew = 0;
function banner(on) { document.getElementById("disconnected").hidden = !on; }
function heardNow() { heard = Date.now(); banner(false); }
function clock() {
  const main = document.querySelector("main");
  skew = Date.now() / 1000 - Number(main.dataset.now || Date.now() / 1000);
}
function connect() {
  events = new EventSource("/dashboard/events?since=" + body.dataset.counter);
  events.onopen = heardNow;
  events.onerror = () => {
    banner(true);
    if (events.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  };
  events.addEventListener("beat", heardNow);
  events.addEventListener("update", (e) => {
    heardNow();
    document.querySelector("main").outerHTML = e.data;
    body.dataset.counter = document.querySelector("main").dataset.counter;
    clock();
    tick();
  });
}
function secs(s) {
  s = Math.max(0, s);
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function tick() {
  const now = Date.now() / 1000 - skew;
  for (const el of document.querySelectorAll("[data-loading-since]"))
    el.textContent = "loading for " + (now - Number(el.dataset.loadingSince)).toFixed(0) + " s";
  for (const el of document.querySelectorAll("[data-deadline]"))
    el.textContent = secs(Number(el.dataset.deadline) - now);
  for (const el of document.querySelectorAll("[data-since]"))
    el.textContent = secs(now - Number(el.dataset.since));
}
async function act(button) {
  const out = document.getElementById("action-result");
  const what = button.dataset.action + " " + button.dataset.model;
  button.disabled = true;
  out.textContent = what + "…";
  try {
    const r = await fetch("/v1/operator/" + button.dataset.action, {
      method: "POST", credentials: "same-origin",
      headers: {"content-type": "application/json", "x-csrf-token": csrf},
      body: JSON.stringify({model: button.dataset.model})});
    const answer = await r.json().catch(() => ({}));
    out.textContent = what + ": " + (r.ok ? "done" : ((answer.error || {}).message || r.status));
    out.className = r.ok ? "" : "error";
  } catch (err) {
    out.textContent = what + ": " + err;
    out.className = "error";
  } finally {
    button.disabled = false;
  }
}
document.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-action]");
  if (button) { e.preventDefault(); act(button); }
});
clock();
connect();
setInterval(() => {
  if (Date.now() - heard > 3 * beat) {
    banner(true);  // nothing for three beats: the stream is dead even if no error came
    events.close();
    heard = Date.now();
    connect();
  }
  tick();
}, 1000);
"""
