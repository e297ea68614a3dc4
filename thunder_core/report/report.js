// Draws the report's colours, timings and tables from the JSON data embedded in the page.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const colors = data.colors || {};

  function colorOf(executor) {
    return colors[executor] || "#999999";
  }

  // Every element naming an executor gets its colour.
  document.querySelectorAll("[data-executor]").forEach(function (el) {
    el.style.setProperty("--ex-color", colorOf(el.dataset.executor));
  });

  function fmt(ms) {
    return ms >= 100 ? ms.toFixed(1) : ms >= 1 ? ms.toFixed(2) : ms.toFixed(3);
  }

  document.querySelectorAll(".report-section").forEach(function (root) {
    drawSection(root, data.sections[Number(root.dataset.section)]);
  });
  document.body.dataset.rendered = "true";

  function drawSection(root, section) {
    const measured = section.measured;
    const regions = (measured && measured.regions) || {};

    // Time badges on the trace lines.
    root.querySelectorAll(".time[data-range]").forEach(function (el) {
      const r = regions[el.dataset.range];
      if (r) {
        el.textContent = fmt(r.ms) + " ms" + (r.calls > 1 ? " / " + r.calls + " calls" : "");
        el.title = "time in this range during one profiled call";
      }
    });

    if (!measured) return;

    // Ranges are "thunder_core/<trace>/<operation> <first output> [<executor>]"; a whole trace is
    // "thunder_core/<trace>".
    const rows = [];
    Object.keys(regions).forEach(function (name) {
      const m = /^thunder_core\/([^/]+)\/(.*) \[([^\]]+)\]$/.exec(name);
      if (!m) return;
      rows.push({ name: name, trace: m[1], op: m[2], executor: m[3], ms: regions[name].ms, calls: regions[name].calls });
    });

    // Time per executor, forward and backward.
    const totals = {};
    rows.forEach(function (r) {
      if (r.executor === "program") return; // a block's call: the ranges inside it are counted
      const phase = /backward/.test(r.trace) ? "backward" : "forward";
      const key = r.executor + "\u0000" + phase;
      totals[key] = (totals[key] || 0) + r.ms;
    });
    const most = Math.max.apply(null, Object.values(totals).concat([1e-9]));
    const body = root.querySelector(".executor-times tbody");
    Object.keys(totals).sort(function (a, b) { return totals[b] - totals[a]; }).forEach(function (key) {
      const parts = key.split("\u0000");
      const tr = document.createElement("tr");
      tr.className = "executor-time";
      tr.dataset.executor = parts[0];
      tr.style.setProperty("--ex-color", colorOf(parts[0]));
      tr.innerHTML = "<td></td><td></td><td class='num'></td><td style='width:60%'><div class='bar'></div></td>";
      tr.children[0].textContent = parts[0];
      tr.children[1].textContent = parts[1];
      tr.children[2].textContent = fmt(totals[key]) + " ms";
      tr.querySelector(".bar").style.width = (100 * totals[key] / most).toFixed(1) + "%";
      body.appendChild(tr);
    });

    // The regions table (the slowest; the trace lines carry every time): sortable, filterable.
    const shown = 300;
    const note = root.querySelector(".regions-note");
    if (note && rows.length > shown) note.textContent = "the " + shown + " slowest of " + rows.length + " ranges";
    rows.sort(function (a, b) { return b.ms - a.ms; }).splice(shown);
    const table = root.querySelector(".regions tbody");
    function draw(sortKey, descending) {
      rows.sort(function (a, b) {
        const x = a[sortKey], y = b[sortKey];
        const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
        return descending ? -order : order;
      });
      table.textContent = "";
      rows.forEach(function (r) {
        const tr = document.createElement("tr");
        tr.className = "region-time";
        tr.dataset.executor = r.executor;
        tr.style.setProperty("--ex-color", colorOf(r.executor));
        tr.innerHTML = "<td><code></code></td><td><i class='ex-dot'></i><span></span></td><td class='num'></td><td class='num'></td><td class='num'></td>";
        tr.querySelector("code").textContent = r.trace + "/" + r.op;
        tr.querySelector("span").textContent = r.executor;
        tr.children[2].textContent = r.calls;
        tr.children[3].textContent = fmt(r.ms);
        tr.children[4].textContent = fmt(r.ms / r.calls);
        table.appendChild(tr);
      });
      applyFilter();
    }
    const keys = ["op", "executor", "calls", "ms", "ms"];
    let current = { key: "ms", descending: true };
    root.querySelectorAll(".regions th").forEach(function (th, i) {
      th.addEventListener("click", function () {
        const key = keys[i];
        current = { key: key, descending: current.key === key ? !current.descending : true };
        draw(current.key, current.descending);
      });
    });

    const hidden = new Set();
    function applyFilter() {
      root.querySelectorAll(".regions tr.region-time, .ops [data-executor]").forEach(function (el) {
        el.classList.toggle("hidden", hidden.has(el.dataset.executor));
      });
    }
    const filter = root.querySelector(".region-filter");
    Array.from(new Set(rows.map(function (r) { return r.executor; }))).sort().forEach(function (name) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = true;
      box.addEventListener("change", function () {
        if (box.checked) hidden.delete(name); else hidden.add(name);
        applyFilter();
      });
      label.appendChild(box);
      label.appendChild(document.createTextNode(" " + name));
      filter.appendChild(label);
    });
    draw("ms", true);
  }
})();
