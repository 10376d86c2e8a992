// vlembed search page: POST /v1/search, thumbnails, and the match heatmap of a hit.
// Plain JS, no dependencies. The API key (if the service has one) lives in sessionStorage.
"use strict";

const KEY_STORE = "vlembed.apiKey";
const $ = (id) => document.getElementById(id);
const state = { hits: [], tokens: [], thumbs: new Map(), opener: null, current: -1 };

// a perceptual ramp (magma-like): value in [0, 1] -> [r, g, b]
const RAMP = [[0, 0, 4], [59, 15, 112], [140, 41, 129], [222, 73, 104], [254, 159, 109],
              [252, 253, 191]];
function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2), f = x - i;
  return RAMP[i].map((c, j) => Math.round(c + f * (RAMP[i + 1][j] - c)));
}

function apiKey() { return sessionStorage.getItem(KEY_STORE) || ""; }

async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", "Bearer " + key);
  const resp = await fetch(path, { ...init, headers });
  if (!resp.ok) {
    let message = resp.status + " " + resp.statusText;
    try { message = (await resp.json()).error.message || message; } catch (_) { /* not JSON */ }
    const err = new Error(message);
    err.status = resp.status;
    throw err;
  }
  return resp;
}

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

async function search(event) {
  event.preventDefault();
  const query = $("q").value;
  const k = Math.min(Math.max(parseInt($("k").value, 10) || 10, 1), 100);
  const body = { query, k, match_map: true };
  const source = $("source").value.trim();
  if (source) body.filter = { source };
  setStatus("Searching…");
  const started = performance.now();
  try {
    const resp = await api("/v1/search", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    const data = await resp.json();
    state.hits = data.data;
    state.tokens = data.query_tokens;
    render();
    const ms = Math.round(performance.now() - started);
    setStatus(`${state.hits.length} result${state.hits.length === 1 ? "" : "s"} in ${ms} ms`);
  } catch (err) {
    if (err.status === 401) {
      $("key-box").open = true;
      $("api-key").focus();
      setStatus("This service needs an API key: enter it above, then search again.", true);
    } else {
      setStatus(err.message, true);
    }
  }
}

function basename(path) { return path.split(/[\\/]/).pop(); }

function render() {
  for (const url of state.thumbs.values()) URL.revokeObjectURL(url);
  state.thumbs.clear();
  const list = $("results");
  list.replaceChildren();
  state.hits.forEach((hit, i) => {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "hit";
    button.dataset.index = String(i);
    button.dataset.score = String(hit.score);
    button.setAttribute("aria-label",
      `Result ${hit.rank}: ${basename(hit.source)} page ${hit.page}, score ${hit.score.toFixed(4)}`);
    const img = document.createElement("img");
    img.alt = "";
    const score = document.createElement("span");
    score.className = "score";
    score.innerHTML = `<span class="rank">#${hit.rank}</span> `;
    score.append(hit.score.toFixed(4));
    const src = document.createElement("span");
    src.className = "src";
    src.textContent = `${basename(hit.source)} · p. ${hit.page}`;
    src.title = hit.source;
    button.append(img, score, src);
    button.addEventListener("click", () => openHit(i));
    li.append(button);
    list.append(li);
    thumbnail(hit).then((url) => { img.src = url; }).catch(() => { img.alt = "no thumbnail"; });
  });
}

async function thumbnail(hit) {
  if (!state.thumbs.has(hit.id)) {
    const blob = await (await api(hit.thumbnail_url)).blob();
    state.thumbs.set(hit.id, URL.createObjectURL(blob));
  }
  return state.thumbs.get(hit.id);
}

// arrow keys move focus in the grid (up/down by a row of the current layout)
function moveFocus(event) {
  const buttons = [...document.querySelectorAll("#results .hit")];
  const i = buttons.indexOf(document.activeElement);
  if (i < 0) return;
  const top = buttons[0].offsetTop;
  const perRow = Math.max(1, buttons.filter((b) => b.offsetTop === top).length);
  const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: perRow, ArrowUp: -perRow }[event.key];
  let j;
  if (step !== undefined) j = i + step;
  else if (event.key === "Home") j = 0;
  else if (event.key === "End") j = buttons.length - 1;
  else return;
  event.preventDefault();
  buttons[Math.min(Math.max(j, 0), buttons.length - 1)].focus();
}

async function openHit(i) {
  const hit = state.hits[i];
  state.current = i;
  state.opener = document.activeElement;
  const title = $("viewer-title");
  title.textContent = `#${hit.rank} · ${basename(hit.source)} · page ${hit.page} · score ${hit.score.toFixed(4)}`;
  title.title = hit.source;
  const select = $("token");
  select.replaceChildren(new Option("all query tokens (best match)", "-1"));
  state.tokens.forEach((tok, t) => {
    const label = typeof tok === "string" ? JSON.stringify(tok) : `token ${tok}`;
    select.append(new Option(`${t}: ${label}`, String(t)));
  });
  select.disabled = !hit.match_map;
  const canvas = $("heatmap");
  canvas.width = 0;
  $("viewer").showModal();
  const img = $("page-img");
  img.alt = `${basename(hit.source)} page ${hit.page}`;
  try {
    img.src = await thumbnail(hit);
    await img.decode();
  } catch (_) { /* the map is drawn over the empty frame */ }
  draw();
}

function draw() {
  const hit = state.hits[state.current];
  const canvas = $("heatmap");
  canvas.hidden = !$("show-map").checked;
  if (!hit || !hit.match_map) return;
  const t = parseInt($("token").value, 10);
  const rows = t < 0 ? hit.match_map.values : hit.match_map.token_values[t];
  const [h, w] = hit.match_map.grid;
  let lo = Infinity, hi = -Infinity;
  for (const row of rows) for (const v of row) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const span = hi - lo || 1;
  canvas.width = w;   // one canvas pixel per merged image token, scaled by CSS
  canvas.height = h;
  canvas.dataset.min = String(lo);
  canvas.dataset.max = String(hi);
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(w, h);
  rows.forEach((row, y) => row.forEach((v, x) => {
    const [r, g, b] = colour((v - lo) / span);
    image.data.set([r, g, b, 255], (y * w + x) * 4);
  }));
  ctx.putImageData(image, 0, 0);
  $("legend-min").textContent = lo.toFixed(3);
  $("legend-max").textContent = hi.toFixed(3);
}

function closed() {
  state.current = -1;
  if (state.opener && state.opener.isConnected) state.opener.focus();
}

document.addEventListener("DOMContentLoaded", () => {
  const key = $("api-key");
  key.value = apiKey();
  key.addEventListener("input", () => {
    if (key.value) sessionStorage.setItem(KEY_STORE, key.value);
    else sessionStorage.removeItem(KEY_STORE);
  });
  $("search-form").addEventListener("submit", search);
  $("results").addEventListener("keydown", moveFocus);
  $("token").addEventListener("change", draw);
  $("show-map").addEventListener("change", draw);
  $("close").addEventListener("click", () => $("viewer").close());
  $("viewer").addEventListener("close", closed);
});
