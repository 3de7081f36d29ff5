// wb ui: the live parts of the server-rendered pages (docs/ui.md). No library, no build step.
// Every fragment comes from the server, already escaped; text from a stream is added as text.
"use strict";

function refresh(id) {
  const box = document.getElementById(id);
  if (!box || !box.dataset.fragment) return Promise.resolve();
  return fetch(box.dataset.fragment, { credentials: "same-origin" })
    .then((answer) => (answer.ok ? answer.text() : Promise.reject(answer.status)))
    .then((html) => { box.innerHTML = html; wireForms(box); })
    .catch(() => {});
}

function later(work, ms) {
  let timer = null;
  return () => { if (!timer) timer = setTimeout(() => { timer = null; work(); }, ms); };
}

function wireForms(root) {
  for (const form of root.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); return; }
      const yes = document.createElement("input");
      yes.type = "hidden"; yes.name = "confirm"; yes.value = "yes";
      form.appendChild(yes);
    });
  }
}

// How long ago, in the largest whole unit: the words pages.py writes (relative_words).
function ago(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size) return Math.floor(seconds / size) + unit + " ago";
  }
  return seconds + "s ago";
}

function updateTimes() {
  for (const time of document.querySelectorAll("time[datetime]")) {
    const at = Date.parse(time.dateTime);
    if (!Number.isNaN(at)) time.textContent = ago((Date.now() - at) / 1000);
  }
}

function fleetPage() {
  setInterval(updateTimes, 30000);
  const soon = later(() => refresh("fleet"), 100);
  const stream = new EventSource(document.body.dataset.live);
  stream.addEventListener("open", soon);  // anything missed while (re)connecting
  stream.addEventListener("change", soon);
  for (const select of document.querySelectorAll("#filters select")) {
    select.addEventListener("change", () => select.form.submit());
  }
}

// A comment on a line of the diff: a box under the line, sent with the review form (its `form` attribute)
// under the name `c PATH:LINE`, so the follow-up task says where each comment is (courier/ui/actions.py).
function commentOn(line) {
  const next = line.nextElementSibling;
  if (next && next.classList.contains("comment-box")) { next.querySelector("textarea").focus(); return; }
  const box = document.createElement("span");
  box.className = "comment-box";
  const text = document.createElement("textarea");
  text.name = "c " + line.dataset.at;
  text.setAttribute("form", "review");
  text.rows = 2;
  text.placeholder = "comment on " + line.dataset.at;
  box.appendChild(text);
  line.after(box);
  text.focus();
}

function runPage() {
  const review = document.getElementById("review");
  const diff = document.getElementById("diff");
  diff.addEventListener("click", (event) => {
    const line = event.target.closest(".line[data-at]");
    if (line && !review.hidden) commentOn(line);
  });
  const actions = document.getElementById("actions");
  // Facts (and the stop/continue form with them) are fetched again only while the run is live:
  // a finished run's page keeps what the user types into the continue form.
  const live = () => { const s = document.getElementById("status"); return s && s.dataset.terminal === "false"; };
  // The review (continue with comments) is for a finished run, as continue is.
  const reviewable = () => { const s = document.getElementById("status"); review.hidden = !s || live(); };
  reviewable();
  const facts = () => (live() ? refresh("facts").then(reviewable) : Promise.resolve());
  refresh("diff");
  let fresh = true;  // the stream replays every action from the first: it replaces what the page showed
  const stream = new EventSource(actions.dataset.live);
  stream.addEventListener("open", () => { fresh = true; });
  const add = (text, kind) => {
    if (fresh) { actions.textContent = ""; fresh = false; }
    const line = document.createElement("span");
    if (kind) line.className = kind;
    line.textContent = text + "\n";
    actions.appendChild(line);
    actions.scrollTop = actions.scrollHeight;
  };
  stream.addEventListener("message", (event) => add(event.data, ""));
  // A worker action with the time its line reached wb (null when the machine did not note it).
  stream.addEventListener("action", (event) => {
    const action = JSON.parse(event.data);
    if (fresh) { actions.textContent = ""; fresh = false; }
    const line = document.createElement("span");
    line.className = "action";
    const when = document.createElement("time");
    if (action.at) {
      const at = new Date(action.at);
      when.dateTime = action.at;
      when.title = at.toString();
      when.textContent = at.toTimeString().slice(0, 8);
    } else {
      when.textContent = "--:--:--";
    }
    line.appendChild(when);
    line.appendChild(document.createTextNode(" " + action.text + "\n"));
    actions.appendChild(line);
    actions.scrollTop = actions.scrollHeight;
  });
  stream.addEventListener("warning", (event) => add("warning: " + event.data, "warning"));
  stream.addEventListener("error", (event) => { if (event.data) add("error: " + event.data, "error"); });
  stream.addEventListener("end", () => {
    stream.close();
    if (live()) { facts(); refresh("diff"); }
  });
  const again = setInterval(() => {  // durations and stall; the stream says when it ends
    if (stream.readyState === EventSource.CLOSED) clearInterval(again); else facts();
  }, 5000);
}

document.addEventListener("DOMContentLoaded", () => {
  wireForms(document);
  if (document.body.dataset.page === "fleet") fleetPage();
  if (document.body.dataset.page === "run") runPage();
});
