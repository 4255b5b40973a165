// streamrec live dashboard: polls /stats every interval_s and draws plain SVG line charts.
// Every step is guarded so that a missing figure, a down component or a failed request only
// shows as such; the page keeps polling.
(function () {
  "use strict";

  var SVG_NS = "http://www.w3.org/2000/svg";
  var W = 460, H = 150, ML = 46, MR = 8, MT = 8, MB = 18;
  var CHARTS = [
    { id: "ingest", title: "Events/s accepted by ingest", series: [["ingest_eps", "events/s"]] },
    { id: "samples", title: "Samples/s produced (samples topic)", series: [["samples_ps", "samples/s"]] },
    { id: "trainer", title: "Trainer examples/s", series: [["trainer_eps", "examples/s"]] },
    { id: "quality", title: "Rolling test-then-train Recall@K vs popularity",
      series: [["recall", "model"], ["recall_baseline", "best live baseline"]], fmt: 3 },
    { id: "latency", title: "Serving latency (ms)", series: [["p50_ms", "p50"], ["p99_ms", "p99"]], fmt: 2 },
    { id: "answers", title: "Share of popular / degraded answers",
      series: [["share_popular", "popular"], ["share_degraded", "degraded"]], max: 1, pct: true },
    { id: "freshness", title: "Served model version age (s)", series: [["model_age_s", "age s"]],
      versions: true },
  ];
  var COMPONENTS = ["serving", "ingest", "kafka", "trainer"];
  var intervalMs = 2000;
  var currentUser = "";

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, text) {
    var node = tag.indexOf("svg:") === 0
      ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
    for (var k in (attrs || {})) { node.setAttribute(k, attrs[k]); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function num(v, digits, pct) {
    if (typeof v !== "number" || !isFinite(v)) { return "—"; }
    if (pct) { return (v * 100).toFixed(1) + "%"; }
    if (digits !== undefined) { return v.toFixed(digits); }
    return Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1);
  }

  function age(s) {
    if (typeof s !== "number" || !isFinite(s)) { return "—"; }
    if (s < 120) { return s.toFixed(0) + " s"; }
    if (s < 7200) { return (s / 60).toFixed(1) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }

  function buildCharts() {
    var main = $("charts");
    CHARTS.forEach(function (c) {
      var panel = el("section", { "class": "panel", id: "panel-" + c.id });
      panel.appendChild(el("h2", {}, c.title));
      panel.appendChild(el("div", { "class": "legend", id: "legend-" + c.id }));
      panel.appendChild(el("svg:svg", {
        "class": "chart", id: "chart-" + c.id, viewBox: "0 0 " + W + " " + H,
        "data-points": "0", "data-last-t": "",
      }));
      main.appendChild(panel);
    });
  }

  function drawChart(c, stats) {
    var svg = $("chart-" + c.id);
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var series = stats.series || {};
    var t = series.t_ms || [];
    var t1 = stats.now_ms, t0 = t1 - stats.window_s * 1000;
    var maxV = c.max || 0, total = 0, lastT = null;
    c.series.forEach(function (s) {
      (series[s[0]] || []).forEach(function (v) {
        if (typeof v === "number" && isFinite(v) && v > maxV) { maxV = v; }
      });
    });
    if (!c.max) { maxV = maxV > 0 ? maxV * 1.1 : 1; }
    function x(ms) { return ML + (W - ML - MR) * Math.max(0, (ms - t0)) / (t1 - t0); }
    function y(v) { return MT + (H - MT - MB) * (1 - Math.min(v, maxV) / maxV); }
    svg.appendChild(el("svg:line", { "class": "axis", x1: ML, y1: H - MB, x2: W - MR, y2: H - MB }));
    svg.appendChild(el("svg:line", { "class": "axis", x1: ML, y1: MT, x2: ML, y2: H - MB }));
    svg.appendChild(el("svg:text", { x: ML - 4, y: MT + 8, "text-anchor": "end" },
      c.pct ? num(maxV, 0, true) : num(maxV, c.fmt)));
    svg.appendChild(el("svg:text", { x: ML - 4, y: H - MB, "text-anchor": "end" }, "0"));
    var minutes = Math.round(stats.window_s / 60);
    svg.appendChild(el("svg:text", { x: ML, y: H - 4 }, "−" + minutes + " min"));
    svg.appendChild(el("svg:text", { x: W - MR, y: H - 4, "text-anchor": "end" }, "now"));
    for (var m = 5; m < minutes; m += 5) {
      var xm = x(t1 - m * 60000);
      svg.appendChild(el("svg:line", { "class": "axis", x1: xm, y1: H - MB, x2: xm, y2: H - MB + 3 }));
      svg.appendChild(el("svg:text", { x: xm, y: H - 4, "text-anchor": "middle" }, "−" + m));
    }
    if (c.versions) {
      // a dashed line where the served version changed, labelled with its last part
      var versions = series.model_version || [], prev = null, lastLabel = -1e9;
      versions.forEach(function (v, i) {
        if (v && v !== prev && prev !== null) {
          var xv = x(t[i]);
          svg.appendChild(el("svg:line", { "class": "ver", x1: xv, y1: MT, x2: xv, y2: H - MB }));
          if (xv - lastLabel > 40) {
            var near = xv > W - MR - 40;
            svg.appendChild(el("svg:text", { x: near ? xv - 2 : xv + 2, y: MT + 18,
              "text-anchor": near ? "end" : "start" }, String(v).split("-").pop()));
            lastLabel = xv;
          }
        }
        if (v) { prev = v; }
      });
    }
    var legend = $("legend-" + c.id);
    legend.textContent = "";
    c.series.forEach(function (s, si) {
      var values = series[s[0]] || [];
      var group = el("svg:g", { "data-series": s[0] });
      var seg = [], count = 0;
      var last = values.length ? values[values.length - 1] : null;  // null: no figure now
      function flush() {
        if (seg.length === 1) {
          group.appendChild(el("svg:circle", { "class": "s" + si, cx: seg[0][0], cy: seg[0][1], r: 2 }));
        } else if (seg.length > 1) {
          group.appendChild(el("svg:polyline", { "class": "s" + si, points: seg.map(function (p) {
            return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join(" ") }));
        }
        seg = [];
      }
      for (var i = 0; i < values.length && i < t.length; i++) {
        var v = values[i];
        if (typeof v === "number" && isFinite(v) && t[i] >= t0) {
          seg.push([x(t[i]), y(v)]); count++;
          if (lastT === null || t[i] > lastT) { lastT = t[i]; }
        } else { flush(); }
      }
      flush();
      group.setAttribute("data-points", String(count));
      svg.appendChild(group);
      total += count;
      legend.appendChild(el("span", { "class": "k" + si },
        s[1] + ": " + (c.pct ? num(last, 0, true) : num(last, c.fmt))));
    });
    if (total === 0) {
      svg.appendChild(el("svg:text", { "class": "nodata", x: W / 2, y: H / 2, "text-anchor": "middle" },
        "no data"));
    }
    svg.setAttribute("data-points", String(total));
    svg.setAttribute("data-last-t", lastT === null ? "" : String(lastT));
  }

  function drawComponents(stats) {
    var box = $("components");
    box.textContent = "";
    COMPONENTS.forEach(function (name) {
      var c = (stats.components || {})[name] || {};
      var up = c.up === true ? "true" : (c.up === false ? "false" : "unknown");
      var node = el("span", { "class": "comp", id: "comp-" + name, "data-up": up,
        title: c.url || c.what || "" });
      node.appendChild(el("span", { "class": "dot" }));
      node.appendChild(el("span", {}, name + (up === "true" ? " up" : up === "false" ? " down" : " …")));
      if (up === "false") { node.appendChild(el("span", { "class": "reason" }, c.reason || "unknown")); }
      box.appendChild(node);
    });
  }

  function bytes(v) {
    if (typeof v !== "number" || !isFinite(v)) { return "—"; }
    var units = ["B", "KB", "MB", "GB", "TB"], i = 0;
    while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  // The trainer cluster's roles (stats.cluster, null for a one-process trainer: hidden).
  function drawCluster(stats) {
    var c = stats.cluster, panel = $("cluster");
    var roles = (c && c.roles) || [];
    panel.setAttribute("data-roles", String(roles.length));
    if (!roles.length) { panel.hidden = true; return; }
    panel.hidden = false;
    panel.setAttribute("data-stale", c.stale ? "true" : "false");
    $("cluster-meta").textContent = roles.length + " roles" + (c.stale ? " · last figures (trainer not answering)" : "");
    var body = $("cluster-roles").querySelector("tbody");
    body.textContent = "";
    var head = el("tr");
    [["role"], ["address"], ["user rows", 1], ["item rows", 1], ["sent", 1], ["received", 1],
     ["sent/s", 1], ["received/s", 1], ["steps", 1], ["step ms", 1]].forEach(function (h) {
      head.appendChild(el("th", h[1] ? { "class": "n" } : {}, h[0]));
    });
    body.appendChild(head);
    roles.forEach(function (r) {
      var rows = r.rows || {};
      var tr = el("tr", { id: "cluster-" + r.id, "data-role": r.role,
        "data-rows-user": rows.user === undefined ? "" : String(rows.user),
        "data-rows-item": rows.item === undefined ? "" : String(rows.item),
        "data-sent": r.sent_bytes === null ? "" : String(r.sent_bytes),
        "data-received": r.received_bytes === null ? "" : String(r.received_bytes),
        "data-steps": r.steps === null || r.steps === undefined ? "" : String(r.steps) });
      var label = r.role + " " + r.index + (r.role === "chief" && rows.user !== undefined ? " (admitted)" : "");
      [[label], [r.address], [num(rows.user, 0), 1], [num(rows.item, 0), 1],
       [bytes(r.sent_bytes), 1], [bytes(r.received_bytes), 1], [bytes(r.sent_bps), 1],
       [bytes(r.received_bps), 1], [num(r.steps, 0), 1], [num(r.step_ms, 1), 1]].forEach(function (cell) {
        tr.appendChild(el("td", cell[1] ? { "class": "n" } : {}, cell[0]));
      });
      body.appendChild(tr);
    });
    var k = c.chief || {};
    function wait(name, label) {
      var share = k[name + "_share"];
      return label + " " + num(k[name + "_ms"], 1) + " ms" +
        (typeof share === "number" ? " (" + num(share, 0, true) + " of the time)" : "");
    }
    $("cluster-chief").textContent = "chief per step: " + wait("schedule", "schedule") +
      " · waits: " + wait("fetch", "step result") + ", " + wait("join", "join") + ", " +
      wait("samples", "samples queue") + " · steps in flight " + num(k.in_flight, 0);
  }

  function draw(stats) {
    drawComponents(stats);
    try { drawCluster(stats); } catch (e) { showBanner("cluster: " + e); }
    var model = stats.model || {};
    $("model-version").textContent = model.version || "none yet";
    $("model-age").textContent = age(model.age_s);
    CHARTS.forEach(function (c) {
      try { drawChart(c, stats); } catch (e) { showBanner("chart " + c.id + ": " + e); }
    });
    var upd = $("updated");
    upd.textContent = new Date(stats.now_ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
    upd.setAttribute("data-updated-ms", String(stats.now_ms));
  }

  function showBanner(text) {
    var b = $("banner");
    b.textContent = text;
    b.className = text ? "show" : "";
  }

  function getJSON(url) {
    var ctrl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = setTimeout(function () { if (ctrl) { ctrl.abort(); } }, Math.max(1500, intervalMs - 200));
    return fetch(url, { cache: "no-store", signal: ctrl ? ctrl.signal : undefined })
      .then(function (r) {
        clearTimeout(timer);
        return r.text().then(function (body) {
          var data = null;
          try { data = JSON.parse(body); } catch (e) { data = null; }
          return { status: r.status, data: data };
        });
      }, function (e) { clearTimeout(timer); throw e; });
  }

  // The online store's completeness (serving.store_health), from /health.
  function pollStore() {
    getJSON("/health").then(function (r) {
      var st = (r.data && r.data.store) || {};
      $("store").setAttribute("data-state", st.state || "unknown");
      $("store-state").textContent = st.state || "unknown";
      $("store-reason").textContent = st.reason || "";
    }).catch(function () {
      $("store-state").textContent = "unknown";
    }).then(function () { setTimeout(pollStore, intervalMs); });
  }

  function pollStats() {
    getJSON("/stats").then(function (r) {
      if (r.status !== 200 || !r.data) { throw new Error("HTTP " + r.status); }
      if (r.data.interval_s > 0) { intervalMs = r.data.interval_s * 1000; $("interval").textContent = r.data.interval_s; }
      showBanner("");
      draw(r.data);
    }).catch(function (e) {
      showBanner("stats unavailable (" + (e && e.name === "AbortError" ? "timeout" : e) +
        "); showing the last data, retrying");
    }).then(function () { setTimeout(pollStats, intervalMs); });
  }

  function fillTable(id, header, rows) {
    var body = $(id).querySelector("tbody");
    body.textContent = "";
    var head = el("tr");
    header.forEach(function (h) { head.appendChild(el("th", {}, h)); });
    body.appendChild(head);
    rows.forEach(function (row) {
      var tr = el("tr", { "data-item": row[1] });
      row.forEach(function (cell) { tr.appendChild(el("td", {}, cell)); });
      body.appendChild(tr);
    });
  }

  function pollUser() {
    var user = currentUser;
    if (!user) { setTimeout(pollUser, intervalMs); return; }
    var enc = encodeURIComponent(user);
    var status = [];
    var features = getJSON("/users/" + enc + "/features").then(function (r) {
      if (user !== currentUser) { return; }
      if (r.status === 404) { status.push("no features stored for this user"); fillTable("history", [], []); return; }
      if (r.status !== 200 || !r.data) { status.push("features: HTTP " + r.status); return; }
      var hist = r.data.history || [];
      fillTable("history", ["#", "item", "event", "event time"], hist.map(function (h, i) {
        return [String(i + 1), h.item_id, h.event_type, new Date(h.ts_ms).toISOString().slice(0, 19)];
      }));
    }).catch(function (e) { status.push("features: " + e); });
    var recs = getJSON("/recommend?k=10&user_id=" + enc).then(function (r) {
      if (user !== currentUser) { return; }
      if (r.status !== 200 || !r.data) { status.push("recommend: HTTP " + r.status); return; }
      var d = r.data;
      $("recs-meta").textContent = "model " + (d.model_version || "none") + " · source " + d.source +
        " · " + num(d.took_ms, 1) + " ms";
      $("recs-meta").setAttribute("data-model-version", d.model_version || "");
      fillTable("recs", ["#", "item", "score"], (d.items || []).map(function (it, i) {
        return [String(i + 1), it.item_id, num(it.score, 4)];
      }));
    }).catch(function (e) { status.push("recommend: " + e); });
    Promise.all([features, recs]).then(function () {
      if (user === currentUser) {
        $("user-status").textContent = status.length ? status.join("; ")
          : "updated " + new Date().toISOString().slice(11, 19) + " UTC";
      }
      setTimeout(pollUser, intervalMs);
    });
  }

  function start() {
    buildCharts();
    var params = new URLSearchParams(window.location.search);
    currentUser = params.get("user") || "";
    $("user-id").value = currentUser;
    $("user-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      currentUser = $("user-id").value.trim();
      var url = new URL(window.location.href);
      if (currentUser) { url.searchParams.set("user", currentUser); } else { url.searchParams.delete("user"); }
      window.history.replaceState(null, "", url.toString());
      fillTable("history", [], []); fillTable("recs", [], []);
      $("recs-meta").textContent = "";
      $("user-status").textContent = currentUser ? "loading…" : "";
    });
    pollStats();
    pollStore();
    pollUser();
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); }
  else { start(); }
})();
