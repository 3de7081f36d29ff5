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

function fleetPage() {
  const soon = later(() => refresh("fleet"), 100);
  const stream = new EventSource(document.body.dataset.live);
  stream.addEventListener("open", soon);  // anything missed while (re)connecting
  stream.addEventListener("change", soon);
  for (const select of document.querySelectorAll("#filters select")) {
    select.addEventListener("change", () => select.form.submit());
  }
}

function runPage() {
  const actions = document.getElementById("actions");
  // Facts (and the stop/continue form with them) are fetched again only while the run is live:
  // a finished run's page keeps what the user types into the continue form.
  const live = () => { const s = document.getElementById("status"); return s && s.dataset.terminal === "false"; };
  const facts = () => (live() ? refresh("facts") : Promise.resolve());
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
