// Tessera console: fills the server-rendered shells from the JSON API and the SSE streams of
// this origin. Every value from the farm is written with textContent (or as a DOM property such
// as href built from encodeURIComponent), never as HTML: a project or an error message that
// contains markup shows as text. No library, no build step.
"use strict";

(function () {
  const body = document.body;
  const OPERATOR = body.dataset.role === "operator";
  const CSRF = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const PAGE_SIZE = 50;
  const FINAL = new Set(["completed", "failed_terminal", "dead_lettered", "cancelled"]);
  // tile state -> fill colour of the grid (and the legend)
  const TILE_COLOURS = {
    queued: "#5a6270",
    leased: "#c9a227",
    progressing: "#e3b505",
    done: "#2e9e5b",
    failed_retryable: "#e07b39",
    failed_terminal: "#c0392b",
    dead_lettered: "#8e44ad",
    cancelled: "#34383f",
  };

  // ---- helpers ----------------------------------------------------------------------------

  /** An element with properties/attributes and children (strings become text nodes). */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key in node && key !== "list") node[key] = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const $ = (sel) => document.querySelector(sel);
  const jobUrl = (id) => "/jobs/" + encodeURIComponent(id);
  const apiJob = (id) => "/api/jobs/" + encodeURIComponent(id);

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString();
  }

  function percent(done, total) {
    return total > 0 ? Math.min(100, Math.round((100 * done) / total)) : 0;
  }

  function tileText(s) {
    // the edge, "104 (auto)" when the scheduler picked it, "auto" until it has
    if (!s.tile_auto) return String(s.tile_size);
    return s.tile_size ? s.tile_size + " (auto)" : "auto (not planned yet)";
  }

  function progressBar(done, total) {
    const pct = percent(done, total);
    const bar = el("span", { class: "progress", title: done + " / " + total });
    bar.append(el("span", { class: "fill" }), el("span", { class: "label", text: pct + "%" }));
    bar.firstChild.style.width = pct + "%";
    return bar;
  }

  function notice(message, kind) {
    const box = $("#notice");
    box.textContent = message;
    box.className = "notice " + (kind || "error");
    box.hidden = !message;
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** fetch() a JSON route of the API; throws ApiError with the reply's {error: {code, message}}. */
  async function api(path, options) {
    const init = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    init.headers = Object.assign({ Accept: "application/json" }, init.headers);
    if (init.json !== undefined) {
      init.body = JSON.stringify(init.json);
      init.headers["Content-Type"] = "application/json";
      delete init.json;
    }
    if (init.method && init.method !== "GET") init.headers["X-CSRF-Token"] = CSRF;
    const reply = await fetch(path, init);
    let data = null;
    try {
      data = await reply.json();
    } catch (_) {
      data = null;
    }
    if (!reply.ok) {
      const err = (data && data.error) || {};
      if (reply.status === 401) {
        // the session expired (or the token was rotated): log in again, then come back here
        location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
      }
      throw new ApiError(reply.status, err.code || String(reply.status), err.message || reply.statusText);
    }
    return data;
  }

  const post = (path, json) => api(path, { method: "POST", json: json || {} });

  function failed(err) {
    notice(err instanceof ApiError ? err.code + ": " + err.message : String(err));
  }

  /** An EventSource on `path`; `handlers` maps an event name to a function of its JSON data. */
  function live(path, handlers) {
    const badge = $("#live");
    const source = new EventSource(path, { withCredentials: true });
    source.onopen = () => {
      badge.textContent = "live";
      badge.classList.add("on");
    };
    source.onerror = () => {
      badge.textContent = "reconnecting";
      badge.classList.remove("on");
    };
    for (const [name, handler] of Object.entries(handlers)) {
      source.addEventListener(name, (event) => {
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        // a harness (tests, bench/web.py) that sets window.__tesseraSeen to [] sees every event
        if (Array.isArray(window.__tesseraSeen)) window.__tesseraSeen.push({ name, data, at: Date.now() });
        handler(data, name);
      });
    }
    window.addEventListener("pagehide", () => source.close());
    return source;
  }

  /** Calls fn at most once per `ms`, trailing: bursts of events become one call. */
  function throttle(fn, ms) {
    let timer = null;
    let last = 0;
    return function () {
      if (timer) return;
      const wait = Math.max(0, last + ms - Date.now());
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, wait);
    };
  }

  /** Paging with the API's `after` cursor: a stack of the cursors of the pages seen. */
  class Pager {
    constructor(load) {
      this.load = load;
      this.cursors = [null];
      this.next = null;
      $("#page-next").addEventListener("click", () => {
        this.cursors.push(this.next);
        this.show();
      });
      $("#page-first").addEventListener("click", () => {
        this.cursors = [null];
        this.show();
      });
    }
    get after() {
      return this.cursors[this.cursors.length - 1];
    }
    async show() {
      try {
        this.next = await this.load(this.after);
      } catch (err) {
        failed(err);
      }
      $("#page-next").disabled = !this.next;
      $("#page-first").disabled = this.cursors.length <= 1;
      const info = $("#page-info");
      if (info) info.textContent = "page " + this.cursors.length;
    }
  }

  // ---- jobs -------------------------------------------------------------------------------

  function jobsPage() {
    const form = $("#filters");
    const tbody = $("#jobs tbody");
    const rows = new Map(); // job_id -> <tr>

    function filters() {
      const q = new URLSearchParams();
      const state = form.elements.namedItem("state").value;
      const project = form.elements.namedItem("project").value.trim();
      if (state) q.set("state", state);
      if (project) q.set("project", project);
      return q;
    }

    function query(after) {
      const q = filters();
      q.set("limit", String(PAGE_SIZE));
      if (after) q.set("after", after);
      return q;
    }

    function progressCell(job) {
      if (job.samples_total !== undefined) return progressBar(job.samples_done, job.samples_total);
      return el("span", { class: "muted", text: "…" });
    }

    function row(job) {
      const thumb = el("img", {
        class: "thumb",
        alt: "",
        loading: "lazy",
        width: 64,
        height: 48,
        src: apiJob(job.job_id) + "/preview.png?max_edge=64",
      });
      thumb.addEventListener("error", () => thumb.classList.add("none"));
      return el(
        "tr",
        { "data-job": job.job_id },
        el("td", {}, thumb),
        el("td", {}, el("a", { class: "id", href: jobUrl(job.job_id), text: job.job_id })),
        el("td", {}, el("span", { class: "state s-" + job.state, text: job.state })),
        el("td", { class: "project", text: job.project }),
        el("td", { text: job.renderer }),
        el("td", { text: job.width + "×" + job.height + " · " + job.spp + " spp" }),
        el("td", { text: job.priority }),
        el("td", { class: "progress-cell" }, progressCell(job)),
        el("td", { text: when(job.created_at) }),
      );
    }

    // The list reply has no progress: the rows on screen ask for their status, four at a time.
    async function fillProgress(jobs) {
      const queue = jobs.filter((j) => j.samples_total === undefined);
      const worker = async () => {
        for (let job = queue.shift(); job; job = queue.shift()) await refreshRow(job.job_id);
      };
      await Promise.all([worker(), worker(), worker(), worker()]);
    }

    async function refreshRow(id) {
      const tr = rows.get(id);
      if (!tr) return;
      try {
        const status = await api(apiJob(id));
        const fresh = row(status);
        tr.replaceWith(fresh);
        rows.set(id, fresh);
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) failed(err);
      }
    }

    async function load(after) {
      const reply = await api("/api/jobs?" + query(after));
      const jobs = reply.jobs || [];
      rows.clear();
      tbody.replaceChildren(...jobs.map((job) => {
        const tr = row(job);
        rows.set(job.job_id, tr);
        return tr;
      }));
      $("#jobs-empty").hidden = jobs.length > 0;
      fillProgress(jobs);
      return reply.next_cursor || null;
    }

    const pager = new Pager(load);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const q = filters().toString();
      history.replaceState(null, "", q ? "/?" + q : "/");
      pager.cursors = [null];
      pager.show();
    });
    pager.show();

    const pending = new Set();
    const flush = throttle(() => {
      for (const id of pending) refreshRow(id);
      pending.clear();
    }, 1000);
    const changed = (data) => {
      if (rows.has(data.job_id)) {
        pending.add(data.job_id);
        flush();
      }
    };
    const handlers = { "tile-done": changed };
    for (const kind of ["job-completed", "job-failed", "job-cancelled", "job-paused", "job-resumed",
      "job-dead-lettered", "job-retried"]) handlers[kind] = changed;
    live("/api/events", handlers);

    $("#submit").addEventListener("submit", async (event) => {
      event.preventDefault();
      const field = (name) => event.target.elements.namedItem(name).value.trim();
      const request = { project: field("project"), scene: field("scene") };
      for (const name of ["width", "height", "spp", "priority"]) request[name] = Number(field(name));
      const tile = field("tile_size").toLowerCase();
      request.tile_size = tile === "auto" ? "auto" : Number(tile);
      try {
        const reply = await post("/api/jobs", request);
        location.assign(jobUrl(reply.job_id));
      } catch (err) {
        failed(err);
      }
    });
  }

  // ---- one job ----------------------------------------------------------------------------

  /** The tiles of a job.tiles reply (or a `tiles` event) as objects: rows of `columns`, or objects. */
  function tileEntries(reply) {
    const rows = Array.isArray(reply) ? reply : reply.tiles || [];
    const columns = reply.columns;
    if (!Array.isArray(columns)) return rows;
    return rows.map((row) => (Array.isArray(row) ? Object.fromEntries(columns.map((c, i) => [c, row[i]])) : row));
  }

  /** Every tile of the job: the first reply, then its further pages (`next_offset`). */
  async function allTiles(path) {
    const first = await api(path);
    const tiles = tileEntries(first);
    let next = first.next_offset;
    while (next !== null && next !== undefined && next > tiles.length - 1) {
      const page = await api(path + "?offset=" + encodeURIComponent(next));
      if (page.offset !== undefined && page.offset !== next) break; // offset not honoured
      tiles.push(...tileEntries(page));
      next = page.next_offset;
    }
    return Object.assign({}, first, { tiles: tiles });
  }

  /** The tile grid on a canvas: one fillRect per tile, redrawn on the next animation frame. */
  class TileGrid {
    constructor(canvas, onPick) {
      this.canvas = canvas;
      this.ctx = canvas.getContext("2d");
      this.job = null;
      this.tiles = [];
      this.scale = 1;
      this.picked = null;
      this.queued = false;
      this.pending = [];
      this.onPick = onPick;
      canvas.addEventListener("mousemove", (e) => this.hover(e, false));
      canvas.addEventListener("click", (e) => this.hover(e, true));
    }
    load(reply) {
      this.job = reply;
      this.tiles = tileEntries(reply);
      // deltas for tiles the grid did not hold yet: re-applied, they cannot move a tile back
      const pending = this.pending;
      this.pending = [];
      this.merge(pending);
      const maxW = Math.min(720, this.canvas.parentElement.clientWidth || 720);
      this.scale = Math.min(maxW / reply.width, 480 / reply.height);
      this.canvas.width = Math.max(1, Math.round(reply.width * this.scale));
      this.canvas.height = Math.max(1, Math.round(reply.height * this.scale));
      this.draw();
    }
    update(entries) {
      this.merge(entries);
      if (this.job) this.draw();
    }
    merge(entries) {
      for (const t of entries) {
        const old = this.tiles[t.index];
        if (!old) {
          // not in the grid yet (no snapshot, or only its first page): kept for the next one
          this.pending.push(t);
          if (this.pending.length > 20000) this.pending.splice(0, this.pending.length - 20000);
          continue;
        }
        if (old.state === "done" && t.state && t.state !== "done") continue; // a stale delta
        const tile = Object.assign({}, old, t);
        if ((t.state === undefined || t.state === old.state) && t.samples_done < old.samples_done) {
          tile.samples_done = old.samples_done; // an older checkpoint than the grid's
        }
        if (tile.state === "done") tile.samples_done = tile.spp;
        this.tiles[t.index] = tile;
      }
    }
    draw() {
      if (this.queued) return;
      this.queued = true;
      requestAnimationFrame(() => {
        this.queued = false;
        this.paint();
      });
    }
    paint() {
      const { ctx, scale } = this;
      if (this.picked !== null && this.tiles[this.picked]) this.onPick(this.tiles[this.picked]);
      ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
      for (const t of this.tiles) {
        const x = t.x * scale, y = t.y * scale, w = t.w * scale, h = t.h * scale;
        ctx.fillStyle = TILE_COLOURS[t.state] || "#999";
        ctx.fillRect(x, y, w, h);
        if ((t.state === "progressing" || t.state === "leased") && t.spp > 0) {
          // a progressing tile fills bottom-up with its samples
          const part = Math.min(1, t.samples_done / t.spp);
          ctx.fillStyle = TILE_COLOURS.done;
          ctx.fillRect(x, y + h * (1 - part), w, h * part);
        }
        if (w > 6 && h > 6) {
          ctx.strokeStyle = "rgba(0,0,0,0.45)";
          ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1);
        }
      }
      const p = this.picked === null ? null : this.tiles[this.picked];
      if (p) {
        ctx.strokeStyle = "#fff";
        ctx.lineWidth = 2;
        ctx.strokeRect(p.x * scale + 1, p.y * scale + 1, p.w * scale - 2, p.h * scale - 2);
        ctx.lineWidth = 1;
      }
    }
    at(event) {
      if (!this.job) return null;
      const rect = this.canvas.getBoundingClientRect();
      const px = ((event.clientX - rect.left) * this.canvas.width) / rect.width / this.scale;
      const py = ((event.clientY - rect.top) * this.canvas.height) / rect.height / this.scale;
      const size = this.job.tile_size;
      const cols = Math.ceil(this.job.width / size);
      const guess = this.tiles[Math.floor(py / size) * cols + Math.floor(px / size)];
      const inside = (t) => t && px >= t.x && px < t.x + t.w && py >= t.y && py < t.y + t.h;
      return inside(guess) ? guess : this.tiles.find(inside) || null;
    }
    hover(event, sticky) {
      const tile = this.at(event);
      if (!tile) return;
      if (sticky) this.picked = tile.index;
      else if (this.picked !== null) return;
      this.draw();
      this.onPick(tile);
    }
  }

  function facts(dl, pairs) {
    dl.replaceChildren();
    for (const [name, value] of pairs) {
      if (value === null || value === undefined || value === "") continue;
      dl.append(el("dt", { text: name }), el("dd", {}, value));
    }
  }

  function jobPage() {
    const id = body.dataset.jobId;
    const grid = new TileGrid($("#tiles"), showTile);
    const preview = $("#preview");
    let status = null;
    let version = 0;
    let beforeId = null;

    function showTile(t) {
      facts($("#tile-detail"), [
        ["Tile", "#" + t.index + " at " + t.x + "," + t.y + " (" + t.w + "×" + t.h + ")"],
        ["State", t.state],
        ["Samples", t.samples_done + " / " + t.spp],
        ["Attempts", String(t.attempts)],
        ["Takeovers", String(t.takeovers)],
        ["Resumes", String(t.resumes)],
        ["Node", t.node],
        ["Last error", t.last_error_code ? t.last_error_code + ": " + (t.last_error || "") : null],
      ]);
    }

    function legend() {
      const counts = {};
      for (const t of grid.tiles) counts[t.state] = (counts[t.state] || 0) + 1;
      $("#legend").replaceChildren(...Object.keys(TILE_COLOURS).filter((s) => counts[s]).map((s) => {
        const swatch = el("span", { class: "swatch" });
        swatch.style.background = TILE_COLOURS[s];
        return el("li", {}, swatch, s + " " + counts[s]);
      }));
      const done = counts.done || 0;
      $("#tiles-summary").textContent = done + " / " + grid.tiles.length + " done";
    }

    function showStatus(s) {
      status = s;
      const state = $("#job-state");
      state.textContent = s.state;
      state.className = "state s-" + s.state;
      document.title = "Job " + s.job_id.slice(0, 8) + " · " + s.state + " · Tessera";
      facts($("#job-facts"), [
        ["Project", s.project],
        ["Renderer", s.renderer],
        ["Image", s.width + "×" + s.height + ", " + s.spp + " spp, tiles of " + tileText(s)],
        ["Progress", progressBar(s.samples_done, s.samples_total)],
        ["Tiles", s.tiles_done + " / " + s.tiles_total + " done"],
        ["Priority", String(s.priority)],
        ["Generation", String(s.generation)],
        ["Submitted", when(s.created_at)],
        ["Finished", when(s.finished_at)],
        ["Deadline", when(s.deadline_at)],
        ["Waiting", s.waiting],
      ]);
      const error = $("#job-error");
      error.hidden = !s.last_error_code;
      error.textContent = s.last_error_code ? s.last_error_code + ": " + (s.last_error || "") : "";
      const priority = $("#priority");
      if (document.activeElement !== priority) priority.value = s.priority;
      priority.disabled = !OPERATOR || FINAL.has(s.state);
      const links = $("#result-links");
      links.hidden = s.state !== "completed";
      $("#result-png").href = apiJob(s.job_id) + "/image.png";
      $("#result-npy").href = apiJob(s.job_id) + "/image.npy";
      const enabled = {
        pause: !FINAL.has(s.state) && s.state !== "paused" && s.state !== "finalizing",
        resume: s.state === "paused",
        retry: FINAL.has(s.state) && s.state !== "completed",
        cancel: !FINAL.has(s.state),
        priority: !FINAL.has(s.state),
      };
      for (const button of document.querySelectorAll("#controls button[data-action]")) {
        button.disabled = !OPERATOR || !enabled[button.dataset.action];
      }
    }

    async function refreshStatus() {
      try {
        showStatus(await api(apiJob(id)));
      } catch (err) {
        failed(err);
      }
    }

    async function refreshTiles() {
      try {
        grid.load(await allTiles(apiJob(id) + "/tiles"));
        legend();
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) failed(err);
      }
    }

    // The preview reloads at most once a second, and only after something changed.
    const refreshPreview = throttle(() => {
      version += 1;
      const next = new Image();
      next.onload = () => {
        preview.src = next.src;
        preview.dataset.version = String(version);
        if (status) $("#preview-summary").textContent = percent(status.samples_done, status.samples_total) + "% of samples";
      };
      next.src = apiJob(id) + "/preview.png?max_edge=512&v=" + version;
    }, 1000);

    function timelineRow(e) {
      const moved = e.to_state ? (e.from_state || "·") + " → " + e.to_state : "";
      const error = e.error_code ? e.error_code + (e.error ? ": " + e.error : "") : e.error || "";
      return el(
        "tr", {},
        el("td", { text: when(e.at) }),
        el("td", { text: e.kind }),
        el("td", { text: e.tile_index === null || e.tile_index === undefined ? "" : e.tile_index }),
        el("td", { text: moved }),
        el("td", { text: e.node || "" }),
        el("td", { class: "detail", text: e.detail || "" }),
        el("td", { class: "error-text", text: error }),
      );
    }

    async function loadTimeline(older) {
      const q = new URLSearchParams({ limit: "100" });
      if (older && beforeId !== null) q.set("before_id", String(beforeId));
      try {
        const reply = await api(apiJob(id) + "/timeline?" + q);
        const rowsOut = reply.events.map(timelineRow);
        const tbody = $("#timeline tbody");
        if (older) tbody.append(...rowsOut);
        else tbody.replaceChildren(...rowsOut);
        beforeId = reply.next_before_id === undefined ? null : reply.next_before_id;
        $("#timeline-older").hidden = beforeId === null;
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) failed(err);
      }
    }
    $("#timeline-older").addEventListener("click", () => loadTimeline(true));
    const refreshTimeline = throttle(() => loadTimeline(false), 1000);
    const refreshStatusSoon = throttle(refreshStatus, 500);
    const refreshTilesSoon = throttle(refreshTiles, 1000);

    for (const button of document.querySelectorAll("#controls button[data-action]")) {
      button.addEventListener("click", async () => {
        const action = button.dataset.action;
        if (action === "cancel" && !confirm("Cancel this job?")) return;
        const json = action === "priority" ? { priority: Number($("#priority").value) } : {};
        button.disabled = true;
        try {
          const reply = await post(apiJob(id) + "/" + action, json);
          notice(action + ": the job is " + reply.state, "ok");
        } catch (err) {
          failed(err);
        }
        await refreshStatus();
        refreshTimeline();
        if (action === "retry") refreshTiles();
      });
    }

    const onJobEvent = (data) => {
      if (data.job_id && data.job_id !== id) return;
      refreshStatusSoon();
      refreshTimeline();
      refreshPreview();
      if (data.kind === "job-retried") refreshTiles();
    };
    const handlers = {
      tiles: (data) => {
        // `full` (when the stream opens): every tile, or its first page; else what changed
        const entries = tileEntries(data);
        if (data.full && !grid.job && data.tile_size) {
          grid.load(data);
          if ((data.tiles_total || 0) > entries.length) refreshTilesSoon();
        } else {
          if (grid.job && grid.tiles.length < entries.length) refreshTilesSoon(); // planned since
          grid.update(entries);
        }
        legend();
        refreshPreview();
        refreshStatusSoon();
      },
      "tile-done": (data) => {
        grid.update([{ index: data.tile_index, state: "done", node: null }]);
        legend();
        refreshPreview();
        refreshStatusSoon();
        refreshTimeline();
      },
    };
    for (const kind of ["job-completed", "job-failed", "job-cancelled", "job-paused", "job-resumed",
      "job-dead-lettered", "job-retried"]) handlers[kind] = onJobEvent;
    live(apiJob(id) + "/events", handlers);

    refreshStatus().then(refreshTiles);
    loadTimeline(false);
    refreshPreview();
    // A safety net beside the events: a job that is not final is looked at every 5 s.
    setInterval(() => {
      if (status && !FINAL.has(status.state)) {
        refreshStatus();
        refreshPreview();
        if (grid.tiles.length < status.tiles_total) refreshTilesSoon();
      }
    }, 5000);
  }

  // ---- dead letters -----------------------------------------------------------------------

  function dlqPage() {
    const tbody = $("#dlq tbody");
    const selected = new Set();
    const jobFilter = () => $("#dlq-job").value.trim();

    function updateSelection() {
      $("#dlq-selected").textContent = selected.size
        ? selected.size + " selected"
        : jobFilter() ? "nothing selected: acts on job " + jobFilter() : "select letters, or filter by job";
    }

    function row(d) {
      const box = el("input", { type: "checkbox", value: d.seq, title: "select" });
      box.checked = selected.has(d.seq);
      box.addEventListener("change", () => {
        if (box.checked) selected.add(d.seq);
        else selected.delete(d.seq);
        updateSelection();
      });
      return el(
        "tr", { "data-seq": d.seq },
        el("td", {}, box),
        el("td", { text: d.seq }),
        el("td", { text: when(d.time) }),
        el("td", {}, d.job_id ? el("a", { class: "id", href: jobUrl(d.job_id), text: d.job_id }) : ""),
        el("td", { text: d.unit || "" }),
        el("td", { text: d.reason || d.malformed || "" }),
        el("td", { text: d.deliveries === null ? "" : d.deliveries }),
        el("td", { class: "error-text", text: d.error || "" }),
      );
    }

    async function load(after) {
      const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
      if (jobFilter()) q.set("job_id", jobFilter());
      if (after) q.set("cursor", after);
      const reply = await api("/api/dlq?" + q);
      const letters = reply.dead_letters || [];
      tbody.replaceChildren(...letters.map(row));
      $("#dlq-empty").hidden = letters.length > 0;
      $("#dlq-all").checked = false;
      updateSelection();
      return reply.next_cursor || null;
    }

    const pager = new Pager(load);
    $("#dlq-filter").addEventListener("submit", (event) => {
      event.preventDefault();
      selected.clear();
      pager.cursors = [null];
      pager.show();
    });
    $("#dlq-all").addEventListener("change", (event) => {
      for (const box of tbody.querySelectorAll("input[type=checkbox]")) {
        box.checked = event.target.checked;
        box.dispatchEvent(new Event("change"));
      }
    });

    async function requeue(dryRun) {
      const request = { dry_run: dryRun };
      if (selected.size) request.seqs = Array.from(selected).map(Number);
      else if (jobFilter()) request.job_id = jobFilter();
      else {
        notice("Select the letters to requeue, or filter by a job.");
        return;
      }
      try {
        const reply = await post("/api/dlq/requeue", request);
        showReport(reply);
        if (!dryRun) {
          selected.clear();
          await pager.show();
        }
      } catch (err) {
        failed(err);
      }
    }

    function showReport(r) {
      $("#dlq-report").hidden = false;
      $("#dlq-report-title").textContent = r.dry_run ? "Requeue preview (dry run: nothing changed)" : "Requeued";
      $("#dlq-report-counts").textContent = r.requeued + (r.dry_run ? " would be requeued, " : " requeued, ") +
        r.skipped + " skipped, " + r.examined + " examined" + (r.omitted ? ", " + r.omitted + " not listed" : "");
      $("#dlq-report-table tbody").replaceChildren(...r.dead_letters.map((v) => el(
        "tr", {},
        el("td", { text: v.seq }),
        el("td", { text: v.job_id }),
        el("td", { text: v.unit }),
        el("td", { text: v.action }),
        el("td", { text: v.why }),
        el("td", { text: v.generation === null ? "" : v.generation }),
        el("td", { text: v.done ? "yes" : "no" }),
      )));
    }

    $("#live").hidden = true; // no event stream on this page: it changes when you act
    $("#dlq-dry-run").addEventListener("click", () => requeue(true));
    $("#dlq-requeue").addEventListener("click", () => {
      if (confirm("Requeue these dead letters?")) requeue(false);
    });
    pager.show();
  }

  // ---- workers and queues -----------------------------------------------------------------

  // the ten numbers of /api/farm: key, label, how to show the value
  const seconds = (v) => (v === null || v === undefined ? "—" : Number(v).toFixed(v < 10 ? 2 : 0) + " s");
  const ratio = (v) => (v === null || v === undefined ? "—" : (100 * Number(v)).toFixed(1) + " %");
  const count = (v) => (v === null || v === undefined ? "—" : String(v));
  const FARM = [
    ["queue_depth", "Queue depth", count],
    ["oldest_age_s", "Oldest waiting", seconds],
    ["in_flight", "In flight", count],
    ["retry_rate", "Retry rate", ratio],
    ["duplicates_suppressed", "Duplicates suppressed", count],
    ["lease_renewal_failures", "Lease renewal failures", count],
    ["resume_rate", "Resume rate", ratio],
    ["latency_p50_s", "Tile latency p50", seconds],
    ["latency_p95_s", "Tile latency p95", seconds],
    ["latency_p99_s", "Tile latency p99", seconds],
    ["dlq_size", "Dead letters", count],
    ["finalization_failures", "Finalization failures", count],
  ];

  // a worker's current tile: "<job>:<index>" as a string, or an object naming them
  function tileName(t) {
    if (Array.isArray(t)) return String(t[0]).slice(0, 8) + ":" + t[1];
    if (t === null || typeof t !== "object") return String(t);
    const job = t.job_id ? String(t.job_id).slice(0, 8) : "?";
    return job + ":" + (t.tile_index !== undefined ? t.tile_index : t.index);
  }

  function workersPage() {
    async function refresh() {
      try {
        const [farm, workers] = await Promise.all([api("/api/farm"), api("/api/workers")]);
        $("#farm").replaceChildren(...FARM.map(([key, label, show]) =>
          el("div", { class: "number", "data-key": key }, el("dt", { text: label }), el("dd", { text: show(farm[key]) }))));
        $("#farm-window").textContent = "(rates over the last " + farm.window_s + " s)";
        const list = workers.workers || [];
        $("#workers tbody").replaceChildren(...list.map((w) => el(
          "tr", {},
          el("td", { text: w.node }),
          el("td", { text: w.threads }),
          el("td", { text: w.in_hand }),
          el("td", { text: Object.entries(w.renderers || {}).map(([n, v]) => n + " " + v).join(", ") }),
          el("td", { text: w.version }),
          el("td", { text: when(w.started_at) }),
          el("td", { text: (w.current_tiles || []).map(tileName).join(", ") }),
        )));
        $("#workers-empty").hidden = list.length > 0;
        $("#workers-count").textContent = "(" + list.length + ")";
        notice("");
      } catch (err) {
        failed(err);
      }
    }
    $("#live").textContent = "every 2 s";
    refresh();
    setInterval(refresh, 2000);
  }

  const pages = { jobs: jobsPage, job: jobPage, dlq: dlqPage, workers: workersPage };
  const start = pages[body.dataset.page];
  if (start) start();
})();
