// The inspector page (server/static/inspector.html). Plain JavaScript, no framework, no build step.
// Everything it shows comes from this server's own routes; server and user text is only ever set with
// textContent or as attribute values, never parsed as HTML, so nothing a request or a server says can
// become markup.
"use strict";

(() => {
  const CHAT = "/v1/chat/completions/render";
  const COMPLETIONS = "/v1/completions/render";
  // At most this many /detokenize calls at a time (a browser keeps about 6 connections per host).
  const PIECE_CONCURRENCY = 6;
  const WORKERS_REFRESH_MS = 5000;

  const EXAMPLES = [
    {
      name: "Plain chat",
      route: CHAT,
      body: { messages: [{ role: "user", content: "What is the capital of France?" }] },
    },
    {
      name: "With tools",
      route: CHAT,
      body: {
        messages: [{ role: "user", content: "What's the weather in Paris today?" }],
        tools: [
          {
            type: "function",
            function: {
              name: "get_weather",
              description: "Current weather for a city",
              parameters: {
                type: "object",
                properties: { city: { type: "string" }, unit: { type: "string", enum: ["C", "F"] } },
                required: ["city"],
              },
            },
          },
        ],
      },
    },
    {
      name: "Multi-turn",
      route: CHAT,
      body: {
        messages: [
          { role: "system", content: "You are a terse assistant." },
          { role: "user", content: "Name a prime number." },
          { role: "assistant", content: "7" },
          { role: "user", content: "And one larger than 100? ünïcödé ✓" },
        ],
      },
    },
    {
      name: "Completion",
      route: COMPLETIONS,
      body: { prompt: "The capital of France is", max_tokens: 8 },
    },
  ];

  const state = {
    apiKey: null, // typed by the user; lives in this variable only (never stored)
    info: null, // the last /server_info
    pieces: new Map(), // token id -> its text, from /detokenize of that id alone
    workersTimer: null,
    renders: 0, // finished renders, published on the status line (data-renders) for scripts and tests
  };

  const $ = (id) => document.getElementById(id);

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // One call to this server; the body is sent as given (a string is sent as typed). Returns the parsed JSON.
  async function api(path, body) {
    const headers = {};
    if (state.apiKey) headers.Authorization = `Bearer ${state.apiKey}`;
    const init = { method: body === undefined ? "GET" : "POST", headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = typeof body === "string" ? body : JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (exc) {
      throw new ApiError(0, `${path}: the server did not answer (${exc.message})`);
    }
    const text = await response.text();
    let parsed = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch (exc) {
      parsed = null;
    }
    if (!response.ok) {
      const message =
        parsed && parsed.error && typeof parsed.error.message === "string" ? parsed.error.message : text;
      const hint = response.status === 401 ? " — type the server's API key above" : "";
      throw new ApiError(response.status, `${response.status} from ${path}: ${message}${hint}`);
    }
    return parsed;
  }

  function setStatus(node, message, stateName) {
    node.textContent = message;
    node.dataset.state = stateName;
  }

  // --- the server: role, model, fingerprint -------------------------------------------------------------

  async function loadServer() {
    const line = $("server-line");
    let info;
    try {
      info = await api("/server_info");
    } catch (exc) {
      line.textContent = exc.message;
      line.dataset.state = "error";
      return;
    }
    if (!state.info || digestOf(state.info) !== digestOf(info)) state.pieces.clear();
    state.info = info;
    line.dataset.state = "ok";
    line.textContent = "";
    const parts = [
      ["role", info.role],
      ["model", info.model || "(none)"],
      ["version", info.version],
    ];
    if (info.reasoning_parser) parts.push(["reasoning parser", info.reasoning_parser]);
    if (info.tool_call_parser) parts.push(["tool-call parser", info.tool_call_parser]);
    parts.forEach(([label, value], index) => {
      if (index) line.append(" · ");
      line.append(`${label} `);
      line.append(element("code", value));
    });
    showFingerprint(info.render_fingerprint);
    const renders = Boolean(info.render_fingerprint);
    $("render-unavailable").hidden = renders;
    $("render-form").hidden = !renders;
    if (info.role === "router") {
      // A router's page is mostly about its workers: they come first.
      $("render-section").before($("workers-section"));
      $("workers-section").hidden = false;
      await loadWorkers();
      if (state.workersTimer === null) {
        state.workersTimer = setInterval(() => {
          if (!document.hidden) loadWorkers();
        }, WORKERS_REFRESH_MS);
      }
    }
  }

  function digestOf(info) {
    return info && info.render_fingerprint ? info.render_fingerprint.digest : null;
  }

  function showFingerprint(fingerprint) {
    $("fingerprint-section").hidden = !fingerprint;
    if (!fingerprint) return;
    $("fingerprint-digest").textContent = fingerprint.digest;
    const reasons = fingerprint.incomplete_reasons || [];
    $("fingerprint-complete").textContent = fingerprint.complete
      ? "(complete)"
      : `(incomplete: ${reasons.join("; ") || "no reason given"})`;
    $("fingerprint-json").textContent = JSON.stringify(fingerprint, null, 2);
  }

  // --- rendering ---------------------------------------------------------------------------------------

  function pickExample(index) {
    const example = EXAMPLES[index];
    $("route").value = example.route;
    $("request-body").value = JSON.stringify(example.body, null, 2);
  }

  // The text of each id, as `/detokenize` of that id alone gives it (cached per id): exact per token; a token
  // holding part of a multi-byte character decodes to U+FFFD on its own.
  async function fetchPieces(ids) {
    const missing = [...new Set(ids)].filter((id) => !state.pieces.has(id));
    let next = 0;
    const work = async () => {
      while (next < missing.length) {
        const id = missing[next++];
        const answer = await api("/detokenize", { tokens: [id] });
        state.pieces.set(id, answer.prompt);
      }
    };
    await Promise.all(Array.from({ length: Math.min(PIECE_CONCURRENCY, missing.length) }, work));
  }

  function tokenSpan(id, index) {
    const text = state.pieces.get(id);
    const span = element("span", null, `tok c${index % 6}`);
    span.dataset.id = String(id);
    span.dataset.index = String(index);
    span.title = `#${index} · id ${id} · ${JSON.stringify(text)}`;
    if (text === "") span.classList.add("empty");
    // A visible ↵ before each newline (not selectable, so a copy is the exact text).
    text.split("\n").forEach((part, lineIndex) => {
      if (lineIndex) {
        const mark = element("span", "↵", "mark");
        mark.setAttribute("aria-hidden", "true");
        span.append(mark, "\n");
      }
      if (part) span.append(part);
    });
    return span;
  }

  function showTokens(items) {
    const container = $("tokens");
    container.replaceChildren();
    let total = 0;
    items.forEach((item, itemIndex) => {
      if (items.length > 1) container.append(element("h4", `prompt ${itemIndex} · ${item.token_ids.length} tokens`));
      const box = element("div", null, "tokens-item");
      box.dataset.item = String(itemIndex);
      item.token_ids.forEach((id, index) => box.append(tokenSpan(id, index)));
      container.append(box);
      total += item.token_ids.length;
    });
    $("token-count").textContent = items.length > 1 ? `(${total} in ${items.length} prompts)` : `(${total})`;
    $("tokens-section").hidden = false;
  }

  async function render() {
    const status = $("render-status");
    const button = $("render-button");
    const route = $("route").value;
    const text = $("request-body").value;
    button.disabled = true;
    setStatus(status, `Rendering with POST ${route}…`, "busy");
    try {
      try {
        JSON.parse(text);
      } catch (exc) {
        throw new Error(`The request body is not JSON: ${exc.message}`);
      }
      const answer = await api(route, text);
      const items = Array.isArray(answer) ? answer : [answer];
      await fetchPieces(items.flatMap((item) => item.token_ids));
      showTokens(items);
      $("response-json").textContent = JSON.stringify(answer, null, 2);
      $("response-details").hidden = false;
      const count = items.reduce((sum, item) => sum + item.token_ids.length, 0);
      setStatus(status, `Rendered: ${count} tokens.`, "rendered");
    } catch (exc) {
      setStatus(status, exc.message, "error");
    } finally {
      button.disabled = false;
      status.dataset.renders = String(++state.renders);
    }
  }

  function hoverToken(event) {
    const span = event.target.closest(".tok");
    if (!span) return;
    const text = state.pieces.get(Number(span.dataset.id));
    $("token-hover").textContent = `token #${span.dataset.index} · id ${span.dataset.id} · ${JSON.stringify(text)}`;
  }

  // --- the router's workers ----------------------------------------------------------------------------

  async function loadWorkers() {
    let view;
    try {
      view = await api("/workers");
    } catch (exc) {
      setStatus($("gate-line"), exc.message, "error");
      return;
    }
    showGate(view.gate);
    const body = $("workers-body");
    body.replaceChildren(...view.workers.map(workerRow));
    if (!view.workers.length) {
      const row = element("tr");
      const cell = element("td", "No workers: add one with POST /workers or --worker.");
      cell.colSpan = 6;
      row.append(cell);
      body.append(row);
    }
    $("workers-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  function showGate(gate) {
    setStatus($("gate-line"), gate.forwarding ? "Forwarding rendered ids: yes" : "Forwarding rendered ids: no", gate.forwarding ? "rendered" : "error");
    const list = $("gate-reasons");
    list.replaceChildren();
    for (const reason of gate.router_reasons || []) list.append(element("li", `router: ${reason}`));
    for (const [url, reasons] of Object.entries(gate.blocking_workers || {})) {
      list.append(element("li", `${url}: ${reasons.join(", ")}`));
    }
  }

  function cell(...nodes) {
    const td = element("td");
    td.append(...nodes.filter((node) => node !== null && node !== undefined));
    return td;
  }

  function listOf(values) {
    if (!values || !values.length) return null;
    const ul = element("ul");
    for (const value of values) ul.append(element("li", value));
    return ul;
  }

  function workerRow(worker) {
    const row = element("tr");
    row.dataset.url = worker.url;
    const stateNode = element("span", worker.state, `state-${worker.state}`);
    const problem = worker.problem || worker.unusable;
    // fingerprint_matches is null when the router has no fingerprint of its own to compare with.
    let match = "no fingerprint reported";
    if (worker.fingerprint_digest && worker.fingerprint_matches === true) match = "matches the router";
    else if (worker.fingerprint_digest && worker.fingerprint_matches === false) match = "differs from the router";
    else if (worker.fingerprint_digest) match = "(the router has none to compare)";
    const digest = worker.fingerprint_digest ? element("code", worker.fingerprint_digest.slice(0, 16)) : null;
    const forwarding = worker.render_check || (worker.gate_reasons && worker.gate_reasons.length ? "blocked" : "—");
    const load = `${worker.active_requests ?? 0} active · ${worker.routed ?? 0} routed · ${worker.failures ?? 0} failures`;
    const checked =
      worker.seconds_since_check === null || worker.seconds_since_check === undefined
        ? "not checked yet"
        : `checked ${worker.seconds_since_check.toFixed(1)} s ago`;
    row.append(
      cell(element("code", worker.url)),
      cell(stateNode, problem ? element("div", problem, "muted") : null),
      cell(worker.model || "—", worker.model_mismatch ? element("div", worker.model_mismatch, "muted") : null),
      cell(digest, element("div", match, "muted")),
      cell(forwarding, listOf(worker.gate_reasons)),
      cell(load, element("div", checked, "muted")),
    );
    return row;
  }

  // --- wiring ------------------------------------------------------------------------------------------

  function start() {
    const select = $("example");
    EXAMPLES.forEach((example, index) => {
      const option = element("option", example.name);
      option.value = String(index);
      select.append(option);
    });
    select.addEventListener("change", () => pickExample(Number(select.value)));
    pickExample(0);
    $("render-button").addEventListener("click", render);
    $("tokens").addEventListener("mouseover", hoverToken);
    $("workers-refresh").addEventListener("click", loadWorkers);
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      state.apiKey = $("api-key").value.trim() || null;
      loadServer();
    });
    loadServer();
  }

  start();
})();
