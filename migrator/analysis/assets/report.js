// The report page: reads the JSON payload, builds the page with DOM calls only (every string from
// the payload becomes a text node or an attribute value, never markup) and renders the module
// tree lazily: a module's children exist in the DOM only once it is expanded.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var S = D.strs, NP = D.names.p, NS = D.names.s, R = D.rows, T = R.t, ST = D.statuses, LV = D.levels;
  var NN = NP.length, NR = T.length, PAGE = 500, BUDGET = 5000, AUTO_OPEN = 200;
  var KIND = D.kind;

  // ---- small helpers -------------------------------------------------------------------------
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  // What Python's str.isprintable() rejects, written as \xNN / \uNNNN / \UNNNNNNNN as the terminal
  // output does: a bidi override or a zero-width character in a name must not change what is read.
  var UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/gu;
  function hex(c, w) { var h = c.toString(16); while (h.length < w) h = "0" + h; return h; }
  function shown(s, keepNewlines) {
    s = String(s);
    return s.replace(UNPRINTABLE, function (ch) {
      if (ch === " " || (keepNewlines && ch === "\n")) return ch;
      var c = ch.codePointAt(0);
      return c < 0x100 ? "\\x" + hex(c, 2) : c < 0x10000 ? "\\u" + hex(c, 4) : "\\U" + hex(c, 8);
    });
  }
  function num(v) {
    if (typeof v === "string") return v === "inf" ? Infinity : v === "-inf" ? -Infinity : NaN;
    return v;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    var x = num(v);
    if (x !== x) return "NaN";
    if (!isFinite(x)) return x > 0 ? "inf" : "-inf";
    if (x === 0) return "0";
    var a = Math.abs(x);
    if (a >= 1e5 || a < 1e-3) return x.toExponential(2);
    return String(Number(x.toPrecision(4)));
  }
  var UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
  function oneDecimal(x) {  // as Python's format: exact ties round to even
    var t = x * 10, f = Math.floor(t), d = t - f;
    var n = d > 0.5 ? f + 1 : d < 0.5 ? f : (f % 2 === 0 ? f : f + 1);
    return (n / 10).toFixed(1);
  }
  function human(n) {  // display.human_bytes
    if (n < 1024) return n + " B";
    var s = n;
    for (var i = 0; i < UNITS.length; i++) {
      s /= 1024;
      if (s < 1023.95 || i === UNITS.length - 1) return oneDecimal(s) + " " + UNITS[i];
    }
    return n + " B";
  }
  function thousands(n) {  // 12,345 (toLocaleString is ~50 us a call: too slow for 10k rows)
    var s = String(n), out = "", i = s.length;
    for (; i > 3 && s.charAt(i - 4) !== "-"; i -= 3) out = "," + s.slice(i - 3, i) + out;
    return s.slice(0, i) + out;
  }
  function count(n, noun, plural) {
    return thousands(n) + " " + (n === 1 ? noun : (plural || noun + "s"));
  }
  function badge(icon, text, level) {
    var b = el("span", "badge lv" + level);
    var i = el("span", "icon", icon);
    i.setAttribute("aria-hidden", "true");
    b.append(i, el("span", "btext", text));
    return b;
  }
  var nameCache = new Array(NN);
  function fullName(i) {
    if (i < 0) return "";
    var v = nameCache[i];
    if (v !== undefined) return v;
    var chain = [];
    for (var a = i; a >= 0 && nameCache[a] === undefined; a = NP[a]) chain.push(a);
    var prefix = a >= 0 ? nameCache[a] : null;
    for (var k = chain.length - 1; k >= 0; k--) {
      var n = chain[k];
      prefix = prefix === null ? NS[n] : prefix + "." + NS[n];
      nameCache[n] = prefix;
    }
    return nameCache[i];
  }
  function nameSpan(text, cls) { return el("span", "name " + (cls || ""), shown(text)); }
  function arrow() { var a = el("span", "arrow", " → "); return a; }

  // ---- the target tree: children in first-seen order, counts and levels per module ----------
  var kids = new Array(NN), rowsAt = new Array(NN), rootKids = [], seen = new Uint8Array(NN);
  var cnt = new Int32Array(NN), lvl = new Uint8Array(NN), bytes = new Float64Array(NN);
  var worst = KIND === "diff" ? new Float64Array(NN).fill(-1) : null;
  var nbytes = R.n || null, absd = R.x || null;
  for (var r = 0; r < NR; r++) {
    var n = T[r];
    (rowsAt[n] || (rowsAt[n] = [])).push(r);
    for (var c = n; !seen[c]; c = NP[c]) {
      seen[c] = 1;
      var p = NP[c];
      if (p < 0) { rootKids.push(c); break; }
      (kids[p] || (kids[p] = [])).push(c);
    }
    var lv = ST[R.st[r]][3], b = nbytes ? nbytes[r] : 0;
    var d = absd ? num(absd[r]) : null;
    if (d !== null && d !== undefined && d !== d) d = Infinity;
    for (var a = NP[n]; a >= 0; a = NP[a]) {  // modules: the tensors below them
      cnt[a]++;
      if (lv > lvl[a]) lvl[a] = lv;
      bytes[a] += b;
      if (worst && d !== null && d !== undefined && d > worst[a]) worst[a] = d;
    }
  }
  // the diff bars' log scale: the smallest and largest nonzero finite max abs diff
  var logLo = 0, logHi = 0;
  if (absd) {
    var lo = Infinity, hi = -Infinity;
    for (var q = 0; q < NR; q++) {
      var v = num(absd[q]);
      if (v > 0 && isFinite(v)) { if (v < lo) lo = v; if (v > hi) hi = v; }
    }
    if (lo <= hi) { logLo = Math.log10(lo); logHi = Math.log10(hi); }
  }
  // the stats bars' axis: symmetric log around 0, out to the largest finite |value|
  var statMax = 0, statLin = 1;
  if (D.stats) {
    for (var s = 0; s < NR; s++) {
      var lo2 = num(R.mn[s]), hi2 = num(R.mx[s]);
      if (isFinite(lo2) && Math.abs(lo2) > statMax) statMax = Math.abs(lo2);
      if (isFinite(hi2) && Math.abs(hi2) > statMax) statMax = Math.abs(hi2);
    }
    statLin = statMax > 0 ? statMax * 1e-4 : 1;
  }

  // ---- filter state ----------------------------------------------------------------------------
  var query = "", matchRow = null, mcnt = null, nMatch = NR, gen = 0, budget = BUDGET;
  var open = new Set(), closed = new Set(), allOpen = false, lowerNames = null;
  function rowSearchText(r) {
    var t = fullName(T[r]);
    var extra = KIND === "plan" || KIND === "run" ? R.s[r] : KIND === "diff" ? R.an[r] : -1;
    if (extra >= 0 && extra !== T[r]) t += "\n" + fullName(extra);
    if (KIND === "diff" && R.bn[r] >= 0) t += "\n" + fullName(R.bn[r]);
    return t.toLowerCase();
  }
  function isOpen(n) {
    if (closed.has(n)) return false;
    if (open.has(n)) return true;
    var auto = allOpen || (query !== "" && nMatch <= AUTO_OPEN);
    return auto && budget > 0;
  }
  function visibleItems(n) {  // rows as -(r+1), modules as their node
    var ks = n < 0 ? rootKids : (kids[n] || []), out = [];
    for (var i = 0; i < ks.length; i++) {
      var c = ks[i], rs = rowsAt[c];
      if (rs) for (var j = 0; j < rs.length; j++) if (!matchRow || matchRow[rs[j]]) out.push(-(rs[j] + 1));
      if (kids[c] && (!mcnt || mcnt[c] > 0)) out.push(c);
    }
    return out;
  }
  function fill(ul, n) {
    ul.textContent = "";
    ul.dataset.gen = String(gen);
    append(ul, visibleItems(n), 0);
  }
  function append(ul, items, start) {
    var end = Math.min(items.length, start + PAGE), frag = document.createDocumentFragment();
    for (var i = start; i < end; i++) {
      budget--;
      frag.appendChild(items[i] < 0 ? tensorItem(-items[i] - 1) : moduleItem(items[i]));
    }
    if (end < items.length) {
      var li = el("li", "more"), left = items.length - end;
      var btn = el("button", "more-btn", "Show " + thousands(Math.min(PAGE, left)) + " more (" +
        thousands(left) + " not shown)");
      btn.type = "button";
      btn.addEventListener("click", function () {
        li.remove();
        budget = BUDGET;
        append(ul, items, end);
        var focus = ul.children[end] && ul.children[end].querySelector("button");
        if (focus) focus.focus();
      });
      li.appendChild(btn);
      frag.appendChild(li);
    }
    ul.appendChild(frag);
  }
  function moduleItem(n) {
    var li = el("li", "mod lv" + lvl[n]);
    li.dataset.node = String(n);
    li.dataset.path = fullName(n);
    var line = el("div", "line");
    var btn = el("button", "tog");
    btn.type = "button";
    var id = "m" + n;
    btn.setAttribute("aria-controls", id);
    btn.setAttribute("aria-expanded", "false");
    var chev = el("span", "chev");
    chev.setAttribute("aria-hidden", "true");
    btn.append(chev, el("span", "seg", NS[n] === "" ? "(empty)" : shown(NS[n])));
    var lev = LV[lvl[n]];
    var meta = count(cnt[n], "tensor");
    if (nbytes) meta += " · " + human(bytes[n]);
    if (mcnt) meta += " · " + count(mcnt[n], "match", "matches");
    line.append(btn, badge(lev[1], lev[2], lvl[n]), el("span", "meta", meta));
    if (worst && worst[n] >= 0) line.append(diffBar(worst[n], "largest max abs diff below", lvl[n]));
    var ul = el("ul", "kids");
    ul.id = id;
    ul.hidden = true;
    li.append(line, ul);
    if (isOpen(n)) expand(li, false);
    return li;
  }
  function expand(li, user) {
    var n = Number(li.dataset.node), ul = li.lastChild, btn = li.firstChild.firstChild;
    if (user) { open.add(n); closed.delete(n); budget = BUDGET; }
    if (ul.dataset.gen !== String(gen)) fill(ul, n);
    ul.hidden = false;
    btn.setAttribute("aria-expanded", "true");
  }
  function collapse(li) {
    var n = Number(li.dataset.node);
    closed.add(n);
    open.delete(n);
    li.lastChild.hidden = true;
    li.firstChild.firstChild.setAttribute("aria-expanded", "false");
  }
  function tensorItem(r) {
    var st = ST[R.st[r]], li = el("li", "tensor lv" + st[3]), t = T[r];
    li.dataset.name = fullName(t);
    var row = el("div", "trow");
    row.append(badge(st[2], st[1], st[3]), el("span", "seg", NS[t] === "" ? "(empty)" : shown(NS[t])));
    RENDER[KIND === "run" ? "plan" : KIND](row, r);
    li.append(row);
    var notes = D.notes || {}, key = String(r);
    if (notes.hint && notes.hint[key] !== undefined) {
      li.append(el("p", "hint", "Did you mean '" + shown(notes.hint[key]) + "'?"));
    }
    if (notes.error && notes.error[key] !== undefined) li.append(el("p", "err", shown(notes.error[key], true)));
    return li;
  }

  // ---- per-kind tensor rows --------------------------------------------------------------------
  var OP_LABEL = {remap: "rename", index: "renumber", rename: "rename", transpose: "transpose", cast: "cast",
    split: "split", merge: "merge", permute: "permute", stack: "stack", unstack: "unstack", reshape: "reshape"};
  // An op list: a template of string ops (>= 0, an index in S) and renames (-(kind) - 1), whose
  // from and to names are the row's `on` nodes, two per rename.
  function opChips(chips, r) {
    var tpl = D.ops[R.o[r]], nodes = R.on[r] || [], k = 0;
    for (var i = 0; i < tpl.length; i++) {
      var op = tpl[i];
      if (op < 0) { chips.append(renameChip(S[-op - 1], fullName(nodes[k]), fullName(nodes[k + 1]))); k += 2; }
      else chips.append(textChip(S[op]));
    }
  }
  function renameChip(kind, from, to) {
    var chip = el("span", "op op-" + kind), text = OP_LABEL[kind] || kind;
    if (kind === "index") {  // the renumbered segments only: "4 → 2"
      var fa = from.split("."), ta = to.split("."), fd = [], td = [];
      for (var i = 0; i < Math.max(fa.length, ta.length); i++) {
        if (fa[i] !== ta[i]) { fd.push(fa[i] || ""); td.push(ta[i] || ""); }
      }
      text += " " + fd.join(".") + " → " + td.join(".");
    }
    chip.textContent = shown(text);
    chip.title = shown(kind + " " + from + " → " + to);
    return chip;
  }
  function textChip(s) {
    var k = s.split(" ")[0];
    return el("span", "op op-" + (OP_LABEL[k] ? k : "other"), shown(s.split(" -> ").join(" → ")));
  }
  function shapes(cell, before, after) {
    if (before !== null) {
      cell.append(el("span", "ds", before));
      cell.append(arrow());
    }
    var a = el("span", "ds" + (before !== null && before !== after ? " changed" : ""), after === null ? "–" : after);
    cell.append(a);
  }
  var RENDER = {
    plan: function (row, r) {
      var s = R.s[r], t = T[r], cell = el("span", "names");
      if (s >= 0 && s !== t) cell.append(nameSpan(fullName(s), "src"), arrow(), nameSpan(fullName(t), "tgt"));
      else cell.append(nameSpan(fullName(t), "tgt"));
      if (s < 0 && ST[R.st[r]][0] !== "kept") cell.append(el("span", "none", " (no source tensor)"));
      var chips = el("span", "chips");
      if (R.m[r] >= 0) {
        var m = el("span", "op op-module", S[R.m[r]]);
        if (R.mr[r] >= 0) m.title = shown(S[R.mr[r]]);
        chips.append(m);
      }
      if (R.o[r] >= 0) opChips(chips, r);
      if (chips.firstChild) cell.append(chips);
      var sh = el("span", "shapes");
      shapes(sh, R.b[r] >= 0 ? S[R.b[r]] : null, R.a[r] >= 0 ? S[R.a[r]] : null);
      row.append(cell, sh, el("span", "size", R.b[r] < 0 && R.a[r] < 0 ? "" : human(R.n[r])));
    },
    diff: function (row, r) {
      var cell = el("span", "names");
      cell.append(nameSpan(fullName(T[r]), "tgt"));
      if (R.an[r] >= 0 || R.bn[r] >= 0) {
        var w = el("span", "chips");
        if (R.an[r] >= 0) w.append(el("span", "op", "A: " + shown(fullName(R.an[r]))));
        if (R.bn[r] >= 0) w.append(el("span", "op", "B: " + shown(fullName(R.bn[r]))));
        cell.append(w);
      }
      var sh = el("span", "shapes");
      shapes(sh, R.b[r] >= 0 ? S[R.b[r]] : "–", R.a[r] >= 0 ? S[R.a[r]] : "–");
      var m = el("span", "metric"), d = R.x[r];
      if (d !== null && d !== undefined) m.append(diffBar(num(d), "max abs diff", ST[R.st[r]][3]));
      var parts = [];
      if (d !== null && d !== undefined) parts.push("max abs " + fmt(d));
      if (R.y[r] !== null && R.y[r] !== undefined) parts.push("max rel " + fmt(R.y[r]));
      if (R.k[r] !== null && R.k[r] !== undefined) parts.push(thousands(R.k[r]) + " differing");
      if (R.nf[r]) parts.push(thousands(R.nf[r]) + " of them non-finite");
      if (R.f[r] !== null && R.f[r] !== undefined) parts.push("first at " + R.f[r]);
      m.append(el("span", "nums", parts.join(" · ")));
      row.append(cell, sh, m);
    },
    inspect: function (row, r) {
      var cell = el("span", "names");
      cell.append(el("span", "ds", R.a[r] >= 0 ? S[R.a[r]] : "–"));
      if (R.off[r] !== null && R.off[r] !== undefined) cell.append(el("span", "none", " at offset " + R.off[r]));
      if (D.stats && R.fl[r] >= 0) {
        var chips = el("span", "chips"), fl = D.flags[R.fl[r]];
        for (var i = 0; i < fl.length; i++) chips.append(badge("⚠", shown(S[fl[i]]), 1));
        cell.append(chips);
      }
      var m = el("span", "metric");
      if (D.stats) {
        m.append(rangeBar(r));
        var parts = ["min " + fmt(R.mn[r]), "max " + fmt(R.mx[r]), "mean " + fmt(R.me[r])];
        if (R.sd[r] !== null && R.sd[r] !== undefined) parts.push("std " + fmt(R.sd[r]));
        if (R.ma[r] !== null && R.ma[r] !== undefined) parts.push("mean |x| " + fmt(R.ma[r]));
        if (R.z[r] !== null && R.z[r] !== undefined) parts.push("zeros " + fmt(num(R.z[r]) * 100) + "%");
        if (R.nan[r]) parts.push("NaN " + R.nan[r]);
        if (R.inf[r]) parts.push("Inf " + R.inf[r]);
        m.append(el("span", "nums", parts.join(" · ")));
      }
      row.append(cell, m, el("span", "size", human(R.n[r])));
    },
  };
  function diffBar(d, what, level) {
    var bar = el("span", "bar lv" + level);
    var fillEl = el("span", "fill");
    var w = 0;
    if (d !== d || d === Infinity) { w = 100; bar.className += " inf"; }
    else if (d > 0) w = logHi > logLo ? 6 + 94 * (Math.log10(d) - logLo) / (logHi - logLo) : 100;
    fillEl.style.width = w.toFixed(1) + "%";
    bar.appendChild(fillEl);
    bar.setAttribute("role", "img");
    bar.setAttribute("aria-label", what + " " + fmt(d) + " (log scale)");
    bar.title = what + " " + fmt(d);
    return bar;
  }
  function symlog(x) { return (x < 0 ? -1 : 1) * Math.log10(1 + Math.abs(x) / statLin); }
  function rangeBar(r) {
    var bar = el("span", "range"), top = symlog(statMax) || 1;
    function pos(x) { x = num(x); if (x !== x) return 50; if (!isFinite(x)) return x > 0 ? 100 : 0; return 50 + 50 * symlog(x) / top; }
    var lo = pos(R.mn[r]), hi = pos(R.mx[r]);
    var span = el("span", "span");
    span.style.left = lo.toFixed(1) + "%";
    span.style.width = Math.max(0.5, hi - lo).toFixed(1) + "%";
    bar.append(el("span", "zero"), span);
    if (R.sd[r] !== null && R.sd[r] !== undefined && R.me[r] !== null) {
      var me = num(R.me[r]), sd = num(R.sd[r]);
      var a = pos(me - sd), b = pos(me + sd);
      var band = el("span", "band");
      band.style.left = Math.max(lo, a).toFixed(1) + "%";
      band.style.width = Math.max(0.5, Math.min(hi, b) - Math.max(lo, a)).toFixed(1) + "%";
      bar.append(band);
    }
    var mean = el("span", "mean");
    mean.style.left = pos(R.me[r]).toFixed(1) + "%";
    bar.append(mean);
    bar.setAttribute("role", "img");
    bar.setAttribute("aria-label", "values from " + fmt(R.mn[r]) + " to " + fmt(R.mx[r]) + ", mean " + fmt(R.me[r]));
    return bar;
  }

  // ---- the page --------------------------------------------------------------------------------
  var app = document.getElementById("app");
  var header = el("header");
  header.append(el("h1", null, D.title), el("p", "subtitle", shown(D.subtitle)));
  var dl = el("dl", "info");
  for (var i = 0; i < D.info.length; i++) dl.append(el("dt", null, D.info[i][0]), el("dd", null, shown(D.info[i][1])));
  header.append(dl);
  [["metadata", "Metadata"], ["scalars", "Scalars"]].forEach(function (kv) {
    var rows = D[kv[0]];
    if (!rows || !rows.length) return;
    var det = el("details", "kv"), sum = el("summary", null, kv[1] + " (" + count(rows.length, "entry", "entries") + ")");
    var table = el("table"), tb = el("tbody");
    var hr = el("tr");
    hr.append(el("th", null, "key"), el("th", null, "value"));
    var th = el("thead");
    th.append(hr);
    rows.forEach(function (row) {
      var tr = el("tr");
      tr.append(el("td", null, shown(row[0])), el("td", null, shown(row[1], true)));
      tb.append(tr);
    });
    table.append(th, tb);
    det.append(sum, table);
    header.append(det);
  });
  var main = el("main");
  app.append(header, main);

  var sumSec = el("section", "summary");
  sumSec.setAttribute("aria-labelledby", "h-summary");
  var h2 = el("h2", null, "Summary");
  h2.id = "h-summary";
  var counts = el("ul", "counts");
  D.summary.forEach(function (c) {
    var li = el("li", "count lv" + c[4] + (c[2] ? "" : " zero"));
    li.dataset.key = c[0];
    var ic = el("span", "icon", c[3]);
    ic.setAttribute("aria-hidden", "true");
    li.append(ic, el("span", "n", thousands(c[2])), el("span", "label", c[1]));
    counts.append(li);
  });
  sumSec.append(h2, counts);
  main.append(sumSec);

  var treeSec = el("section", "tree-section k-" + (KIND === "run" ? "plan" : KIND));
  treeSec.setAttribute("aria-labelledby", "h-tree");
  var th2 = el("h2", null, KIND === "inspect" ? "Tensors by module" : KIND === "diff" ? "Tensors by module" : "Target modules");
  th2.id = "h-tree";
  var bar = el("div", "toolbar");
  var lab = el("label", null, "Filter by name");
  lab.htmlFor = "filter";
  var input = el("input");
  input.id = "filter";
  input.type = "search";
  input.autocomplete = "off";
  input.spellcheck = false;
  input.placeholder = "part of a name, e.g. attention";
  var status = el("span", "match-count");
  status.id = "match-count";
  status.setAttribute("role", "status");
  var expAll = el("button", null, "Expand all"), colAll = el("button", null, "Collapse all");
  expAll.type = colAll.type = "button";
  expAll.id = "expand-all";
  colAll.id = "collapse-all";
  bar.append(lab, input, expAll, colAll, status);
  var legend = el("p", "legend");
  legend.append("Module status: ");
  LV.forEach(function (l, k) { legend.append(badge(l[1], l[2], k), " "); });
  var cols = el("div", "trow head");
  cols.setAttribute("aria-hidden", "true");
  var HEAD = {
    plan: ["status", "name", "source → target · module · ops", "dtype shape before → after", "size"],
    diff: ["status", "name", "name in A / B", "dtype shape: A → B", "max abs diff (log scale)"],
    inspect: ["status", "name", "dtype shape", D.stats ? "value range (symmetric log scale)" : "", "size"],
  }[KIND === "run" ? "plan" : KIND];
  HEAD.forEach(function (h) { cols.append(el("span", null, h)); });
  var tree = el("ul", "tree");
  tree.id = "tree";
  treeSec.append(th2, bar, legend, cols, tree);
  if (!NR) treeSec.append(el("p", "empty", "No tensors."));
  main.append(treeSec);

  function renderTree() {
    gen++;
    budget = BUDGET;
    fill(tree, -1);
    tree.dataset.query = query;
    status.textContent = query ? count(nMatch, "tensor") + " of " + thousands(NR) + " match" :
      count(NR, "tensor");
  }

  var listViews = [];
  D.lists.forEach(function (L) {
    var sec = el("section", "list");
    sec.id = "list-" + L.key;
    var h = el("h2");
    h.id = "h-" + L.key;
    sec.setAttribute("aria-labelledby", h.id);
    var ic = el("span", "icon lv" + L.level, L.icon);
    ic.setAttribute("aria-hidden", "true");
    var nspan = el("span", "n");
    h.append(ic, " " + L.title + " ", nspan);
    var ul = el("ul", "items");
    var empty = el("p", "empty", L.empty || "None.");
    sec.append(h, ul, empty);
    main.append(sec);
    var lower = null;
    listViews.push(function () {
      var items = L.items;
      if (query) {
        if (!lower) lower = items.map(function (it) { return (it[0] + "\n" + (it[1] || "")).toLowerCase(); });
        items = items.filter(function (it, k) { return lower[k].indexOf(query) >= 0; });
      }
      nspan.textContent = "(" + (query ? thousands(items.length) + " of " : "") +
        thousands(L.items.length) + ")";
      ul.textContent = "";
      empty.hidden = items.length > 0;
      if (!items.length && query) empty.textContent = "None matches the filter.";
      else empty.textContent = L.empty || "None.";
      listAppend(ul, items, 0);
    });
  });
  function listAppend(ul, items, start) {
    var end = Math.min(items.length, start + PAGE), frag = document.createDocumentFragment();
    for (var i = start; i < end; i++) {
      var li = el("li", null, shown(items[i][0], true));
      if (items[i][1]) li.append(el("span", "note", " " + shown(items[i][1], true)));
      frag.append(li);
    }
    if (end < items.length) {
      var more = el("li", "more"), btn = el("button", "more-btn", "Show " + Math.min(PAGE, items.length - end) +
        " more (" + thousands(items.length - end) + " not shown)");
      btn.type = "button";
      btn.addEventListener("click", function () { more.remove(); listAppend(ul, items, end); });
      more.append(btn);
      frag.append(more);
    }
    ul.append(frag);
  }

  function applyFilter() {
    var q = input.value.trim().toLowerCase();
    if (q === query) return;
    query = q;
    if (!q) { matchRow = null; mcnt = null; nMatch = NR; }
    else {
      if (!lowerNames) { lowerNames = new Array(NR); for (var r = 0; r < NR; r++) lowerNames[r] = rowSearchText(r); }
      matchRow = new Uint8Array(NR);
      mcnt = new Int32Array(NN);
      nMatch = 0;
      for (var k = 0; k < NR; k++) {
        if (lowerNames[k].indexOf(q) < 0) continue;
        matchRow[k] = 1;
        nMatch++;
        for (var a = NP[T[k]]; a >= 0; a = NP[a]) mcnt[a]++;
      }
    }
    renderTree();
    listViews.forEach(function (f) { f(); });
  }
  input.addEventListener("input", applyFilter);
  expAll.addEventListener("click", function () { allOpen = true; closed.clear(); renderTree(); });
  colAll.addEventListener("click", function () { allOpen = false; open.clear(); closed.clear(); renderTree(); });

  tree.addEventListener("click", function (ev) {
    var btn = ev.target.closest(".tog");
    if (!btn || !tree.contains(btn)) return;
    var li = btn.parentNode.parentNode;
    if (btn.getAttribute("aria-expanded") === "true") collapse(li); else expand(li, true);
  });
  function visibleButtons() {
    return Array.prototype.filter.call(tree.querySelectorAll("button"), function (b) { return b.offsetParent !== null; });
  }
  tree.addEventListener("keydown", function (ev) {
    var btn = ev.target;
    if (!btn.matches || !btn.matches("button")) return;
    var isTog = btn.classList.contains("tog"), li = btn.closest("li"), k = ev.key, list, i;
    if (k === "ArrowRight" && isTog) {
      if (btn.getAttribute("aria-expanded") !== "true") expand(li, true);
      else { var first = li.lastChild.querySelector("button"); if (first) first.focus(); }
    } else if (k === "ArrowLeft") {
      if (isTog && btn.getAttribute("aria-expanded") === "true") collapse(li);
      else {
        var parent = li.parentNode.closest("li.mod");
        if (parent) parent.querySelector(".tog").focus();
      }
    } else if (k === "ArrowDown" || k === "ArrowUp" || k === "Home" || k === "End") {
      list = visibleButtons();
      i = list.indexOf(btn);
      var j = k === "Home" ? 0 : k === "End" ? list.length - 1 : i + (k === "ArrowDown" ? 1 : -1);
      if (j >= 0 && j < list.length) list[j].focus();
    } else return;
    ev.preventDefault();
  });

  renderTree();
  listViews.forEach(function (f) { f(); });
  document.title = D.title + ": " + shown(D.subtitle);
  document.body.dataset.ready = "1";
})();
