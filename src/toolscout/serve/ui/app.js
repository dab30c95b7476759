// The toolscout playground: plain JavaScript over the public HTTP API (no build step, no dependency).
// Tool names, descriptions and schemas are untrusted text: everything is rendered as text nodes
// (textContent, append of strings), never parsed as HTML.
"use strict";

const TOKEN_KEY = "toolscout.playground.token";
const PAGE_SIZE = 50;
const ALL_NAMESPACES = "all";
const FEEDBACK_FIELDS = [["learned", "requests learned"], ["sources", "sources that taught it"],
                         ["reported", "events that named it"]];

const browsing = {namespace: null, shown: 0};
const server = {reachable: true};
const PROBABILITY_MEANS = "the calibrated probability that the tool is one the task needs: comparable across " +
                          "tasks and catalogs, where the score only orders this task's hits";

// ------------------------------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

function savedToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

// GET `path` (relative to the server root), or POST `body` as JSON; the parsed answer, or an ApiError
// carrying the API's own {"error": {"type", "message"}}.
async function api(path, body) {
  const headers = {Accept: "application/json"};
  const token = savedToken();
  if (token) headers.Authorization = "Bearer " + token;
  const options = {headers};
  if (body !== undefined) {
    options.method = "POST";
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    const error = new ApiError(0, "network_error", "could not reach the toolscout server (" + err.message + ")");
    markUnreachable(error);
    throw error;
  }
  if (!server.reachable) {  // back after a failure: the status line says what the server says again
    server.reachable = true;
    loadStatus();
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.type || "error", error.message || response.statusText);
  }
  return data;
}

// ------------------------------------------------------------------------------------- the page

function byId(id) {
  return document.getElementById(id);
}

// A new element: `attrs` become attributes ("class" included) or, for on* keys, event listeners;
// children are elements or strings (appended as text, never as HTML).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

function namespaceLabel(namespace) {
  return namespace ? namespace : "(no namespace)";
}

function showError(err) {
  const box = byId("error");
  const title = err.status ? err.status + " " + err.type : err.type || "error";
  box.replaceChildren(el("strong", {}, title + ": "), err.message || String(err));
  box.hidden = false;
}

function clearError() {
  byId("error").hidden = true;
  byId("error").replaceChildren();
}

// Runs one user action; an error from it is shown in the banner until the next action.
async function run(action) {
  clearError();
  try {
    await action();
  } catch (err) {
    showError(err);
  }
}

// ------------------------------------------------------------------------------------- server and token

// The status line says the server cannot be reached (what it showed before is no longer known to be true).
function markUnreachable(err) {
  server.reachable = false;
  byId("server-status").textContent = "server unreachable: " + err.message;
}

async function loadStatus() {
  try {
    const health = await api("health");
    byId("server-status").textContent =
      `${health.tools} tools · version ${health.version} · ${health.storage}`;
  } catch (err) {
    byId("server-status").textContent = "server: " + err.message;
  }
}

function showTokenState() {
  byId("token-state").textContent = savedToken() ? "token in use (this tab only)" : "no token";
}

function useToken(event) {
  event.preventDefault();
  const value = byId("token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  byId("token").value = "";
  showTokenState();
  run(refresh);
}

function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  showTokenState();
  run(refresh);
}

// Everything that depends on what the token may see.
async function refresh() {
  await loadStatus();
  await loadNamespaces();
  await loadLearning();
  if (browsing.namespace !== null) await browse(browsing.namespace, 0);
}

// How learning from use is doing: each event is scored before it is learned (GET /learning).
async function loadLearning() {
  const rows = byId("learning").querySelector("tbody");
  rows.replaceChildren();
  const report = await api("learning");
  const frozen = report.frozen_at ? " · frozen since " + new Date(report.frozen_at * 1000).toISOString() : "";
  byId("learning-summary").textContent =
    `${report.requests} requests learned for ${report.tools_taught} tools · ` +
    `${report.events_scored} (event, tool) pairs scored${frozen}` +
    (report.dormant ? ` · ${report.dormant}` : "");
  for (const [namespace, figures] of Object.entries(report.measured.namespaces)) {
    const weight = report.weights[namespace] || {weight: 1, how: "automatic"};
    rows.append(el("tr", {"data-testid": "learning-row", "data-namespace": namespace},
      el("td", {}, namespaceLabel(namespace)),
      el("td", {"data-testid": "learning-events"}, `${figures.first_seen.events} + ${figures.repeats.events}`),
      el("td", {"data-testid": "learning-mrr"}, mrrs(figures.first_seen)),
      el("td", {"data-testid": "learning-weight"}, `${weight.weight.toFixed(2)} (${weight.how})`)));
  }
}

// served / untaught mean reciprocal rank ("-" for no pairs: a mean of nothing is not 0)
function mrrs(figures) {
  return figures.events ? `${figures.served.mrr.toFixed(3)} / ${figures.untaught.mrr.toFixed(3)}` : "-";
}

// ------------------------------------------------------------------------------------- catalog

async function loadNamespaces() {
  byId("namespaces").replaceChildren();
  const counts = (await api("namespaces")).namespaces;
  const names = Object.keys(counts).sort();
  fillNamespaceFilter(names);
  byId("namespaces").replaceChildren(...names.map((name) => namespaceItem(name, counts[name])));
}

function fillNamespaceFilter(names) {
  const select = byId("namespace");
  const chosen = select.value;
  const options = names.map((name) => el("option", {value: "ns:" + name}, namespaceLabel(name)));
  select.replaceChildren(el("option", {value: ALL_NAMESPACES}, "all namespaces"), ...options);
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : ALL_NAMESPACES;
}

function selectedNamespace() {
  const value = byId("namespace").value;
  return value === ALL_NAMESPACES ? null : value.slice(3);
}

function namespaceItem(name, count) {
  const button = el("button", {type: "button", class: "link", "data-namespace": name,
                               onclick: () => run(() => browse(name, 0))}, namespaceLabel(name));
  return el("li", {"data-testid": "namespace"}, button, " ", el("span", {class: "count"}, String(count)));
}

// Shows one page of a namespace's tools (offset 0 starts the list afresh; later pages append).
async function browse(namespace, offset) {
  const params = new URLSearchParams({namespace, offset: String(offset), limit: String(PAGE_SIZE)});
  const page = await api("tools?" + params);
  const list = byId("catalog-tools");
  if (offset === 0) list.replaceChildren();
  list.append(...page.tools.map(catalogItem));
  browsing.namespace = namespace;
  browsing.shown = offset + page.tools.length;
  byId("catalog-summary").textContent =
    `${namespaceLabel(namespace)}: ${browsing.shown} of ${page.total} tools`;
  byId("more-tools").hidden = browsing.shown >= page.total;
  for (const button of byId("namespaces").querySelectorAll("button")) {
    button.classList.toggle("current", button.dataset.namespace === namespace);
  }
}

function catalogItem(tool) {
  return el("li", {class: "catalog-tool", "data-testid": "catalog-tool", "data-id": tool.id},
            toolButton(tool.id, tool.name), el("p", {class: "description"}, tool.description || ""));
}

function toolButton(id, name) {
  return el("button", {type: "button", class: "link tool-name", "data-testid": "open-tool",
                       onclick: () => run(() => showTool(id))}, name);
}

// ------------------------------------------------------------------------------------- search

async function search(event) {
  event.preventDefault();
  const query = byId("task").value.trim();
  if (!query) return;
  const body = {query, k: Number(byId("k").value) || 5, explain: true};
  const namespace = selectedNamespace();
  if (namespace !== null) body.namespaces = [namespace];
  byId("search-summary").textContent = "searching…";
  byId("hits").setAttribute("aria-busy", "true");
  try {
    const answer = await api("search", body);
    showResult(answer.results[0]);
  } catch (err) {
    clearResult("");
    throw err;
  } finally {
    byId("hits").setAttribute("aria-busy", "false");
  }
}

function showResult(result) {
  showDegraded(result.degraded);
  byId("hits").replaceChildren(...result.hits.map((hit) => hitItem(hit, result.query)));
  byId("probability-legend").hidden = !result.hits.some((h) => h.probability != null);
  const ranked = result.hits.filter((h) => h.match !== "always").length;
  byId("search-summary").textContent = result.abstained
    ? "No tool fits this task well enough: the server abstained."
    : `${ranked} ranked ${ranked === 1 ? "tool" : "tools"}` +
      (result.hits.length > ranked ? ` and ${result.hits.length - ranked} always included` : "");
}

// No answer to show (the search failed, or the form would not send it): the last task's hits go, so they
// are never read as this task's. `why`: said in their place.
function clearResult(why) {
  byId("hits").replaceChildren();
  showDegraded(null);
  byId("probability-legend").hidden = true;
  byId("search-summary").textContent = why;
}

// The browser refused to send the form (a k out of range, an empty task): say which field, clear the hits.
function refusedForm(event) {
  clearResult(`Not searched: ${event.target.id}: ${event.target.validationMessage}`);
}

// Enter in the task searches; Shift+Enter (or Enter while an input method composes) is a new line.
function taskKey(event) {
  if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
  event.preventDefault();
  byId("search-form").requestSubmit();
}

// The answer's `degraded`: a stage (the LLM reranker) could not rank the task, so these are the first stage's
// hits; said above them, or nothing (null clears it).
function showDegraded(degraded) {
  const note = byId("degraded");
  note.hidden = !degraded;
  note.textContent = degraded
    ? `The ${degraded.stage} could not rank this task, so these are the first stage's results: ${degraded.reason}`
    : "";
}

function hitItem(hit, task) {
  const head = el("div", {class: "hit-head"},
                  el("span", {class: "rank"}, String(hit.rank)),
                  toolButton(hit.id, hit.name),
                  el("span", {class: "namespace"}, namespaceLabel(hit.namespace)),
                  el("span", {class: "match match-" + hit.match, "data-testid": "match"}, hit.match),
                  el("span", {class: "score", "data-testid": "score", title: String(hit.score)},
                     hit.score.toFixed(3)));
  if (hit.probability != null) {
    head.append(el("span", {class: "probability", "data-testid": "probability",
                            title: `${hit.probability}: ${PROBABILITY_MEANS}`}, "p " + hit.probability.toFixed(2)));
  }
  const served = el("button", {type: "button", class: "link served", "data-testid": "served",
                                title: "report that this tool served the task (POST /feedback): the index learns",
                                onclick: () => run(() => reportServed(task, hit.id, served))}, "it served the task");
  return el("li", {class: "hit", "data-testid": "hit", "data-id": hit.id}, head,
            matchedWords(hit.matched || []), el("p", {class: "description"}, hit.description), served);
}

// Feedback from the page: `task` was served by tool `id` (the token must be one that may give feedback; the API
// says so otherwise). The button becomes what the server did with it.
async function reportServed(task, id, button) {
  const answer = await api("feedback", {query: task, tool_ids: [id]});
  button.replaceWith(el("span", {class: "muted served", "data-testid": "served-said"}, feedbackSaid(answer)));
  await loadLearning();
}

function feedbackSaid(answer) {
  if (answer.learned) return "reported: learned";
  if (answer.duplicates) return "reported before: counted once";
  if (answer.held_by_freeze) return "recorded: learning is frozen";
  if (answer.capped) return "recorded: past this source's cap for the tool";
  if (answer.incidental) return "recorded: a task of only numbers and addresses teaches nothing";
  if (answer.unknown_tools.length) return "not recorded: unknown tool";
  return "recorded: " + (answer.note || "it teaches nothing");
}

function matchedWords(words) {
  const list = el("ul", {class: "words plain", "data-testid": "matched"},
                  ...words.map((word) => el("li", {class: "word"}, word)));
  const label = words.length ? "matched" : "no query word in its text";
  return el("div", {class: "matched"}, el("span", {class: "muted"}, label), list);
}

// ------------------------------------------------------------------------------------- one tool

async function showTool(id) {
  const tool = await api("tools/" + encodeURIComponent(id));
  byId("detail").replaceChildren(...toolDetail(tool));
}

function toolDetail(tool) {
  const {feedback, ...record} = tool;
  const where = [tool.id, namespaceLabel(tool.namespace), tool.method ? `${tool.method} ${tool.path}` : null];
  const parts = [
    el("h3", {"data-testid": "detail-name"}, tool.title || tool.name),
    el("p", {class: "muted", "data-testid": "detail-id"}, where.filter(Boolean).join(" · ")),
    el("p", {class: "description"}, tool.description || ""),
    el("h4", {}, "Feedback from use"),
    feedbackList(feedback || {}),
    el("h4", {}, "Input schema"),
    jsonBlock(tool.parameters || {type: "object", properties: {}}, "schema"),
  ];
  if (tool.returns) parts.push(el("h4", {}, "Returns"), jsonBlock(tool.returns, "returns"));
  parts.push(el("details", {}, el("summary", {}, "Full record"), jsonBlock(record, "record")));
  return parts;
}

function feedbackList(feedback) {
  const rows = FEEDBACK_FIELDS.flatMap(([key, label]) => [
    el("dt", {}, label),
    el("dd", {"data-testid": "feedback-" + key}, String(feedback[key] ?? "–")),
  ]);
  return el("dl", {class: "feedback", "data-testid": "feedback"}, ...rows);
}

function jsonBlock(value, testid) {
  return el("pre", {class: "json", "data-testid": testid}, JSON.stringify(value, null, 2));
}

// ------------------------------------------------------------------------------------- start

function start() {
  byId("token-form").addEventListener("submit", useToken);
  byId("token-forget").addEventListener("click", forgetToken);
  byId("search-form").addEventListener("submit", (event) => run(() => search(event)));
  byId("search-form").addEventListener("invalid", refusedForm, true);  // "invalid" does not bubble
  byId("task").addEventListener("keydown", taskKey);
  byId("probability-legend").textContent = "p: " + PROBABILITY_MEANS + ".";
  byId("more-tools").addEventListener("click", () => run(() => browse(browsing.namespace, browsing.shown)));
  showTokenState();
  run(refresh);
}

start();
