// The live page of p2ptrain's local API. It polls /history (incrementally,
// with ?since=) and /status about once a second and draws the run with its
// own SVG: no library, nothing loaded from elsewhere.
//
// Elements a test can query: every chart series is an element with the id
// series-NAME and a data-points attribute (the number of finite data
// points it holds; data-drawn is how many vertices were drawn after
// decimation); every ring member is a g.ring-node with data-peer="<peer
// ID>"; every ring link is a path.ring-link with data-from and data-to;
// members are rows of #members with data-peer; events are li.event of
// #events with data-event.
'use strict';

(function () {
  const SVG = 'http://www.w3.org/2000/svg';
  const POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 5000;
  // The page keeps at most MAX_POINTS points per kind of record; beyond
  // that it drops every other point (older ones are thinned repeatedly,
  // so a long run keeps its whole shape at a coarser grain).
  const MAX_POINTS = 20000;
  const MAX_EVENTS = 200;
  const MARGIN = { left: 52, right: 12, top: 8, bottom: 22 };

  const $ = (id) => document.getElementById(id);

  function columns(names) {
    const c = { n: 0, names };
    for (const k of names) c[k] = [];
    return c;
  }

  const state = {
    since: 0,
    xMode: 'step',
    status: null,
    lastOK: 0,
    error: '',
    totalSteps: 0,
    codec: '',
    steps: columns(['step', 't', 'loss', 'rate', 'compute', 'allreduce', 'wait', 'bytes']),
    evals: columns(['step', 't', 'acc', 'bpb', 'testLoss']),
    events: [], // newest first
  };

  // ---- numbers and their formats -------------------------------------

  // num returns v if it is a finite number, NaN otherwise (absent fields,
  // nulls, strings).
  function num(v) {
    return typeof v === 'number' && isFinite(v) ? v : NaN;
  }
  // num0 is num for fields that JSON leaves out when they are zero.
  function num0(v) {
    return v === undefined ? 0 : num(v);
  }

  function digitsFor(step) {
    if (!(step > 0)) return 2;
    return Math.min(6, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  }

  const SI = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];

  // fmtSI formats v with an SI suffix and about three significant digits.
  function fmtSI(v, unit) {
    unit = unit || '';
    if (!isFinite(v)) return '—';
    const a = Math.abs(v);
    for (const [f, s] of SI) {
      if (a >= f) return trim((v / f).toPrecision(3)) + ' ' + s + unit;
    }
    if (a === 0) return '0' + (unit ? ' ' + unit : '');
    return trim(a >= 1 ? v.toPrecision(3) : v.toFixed(Math.min(6, 2 - Math.floor(Math.log10(a))))) + (unit ? ' ' + unit : '');
  }
  function trim(s) {
    return s.indexOf('.') < 0 || s.indexOf('e') >= 0 ? s : s.replace(/\.?0+$/, '');
  }
  function fmtTick(v, step) {
    if (Math.abs(v) >= 1e3) return fmtSI(v);
    return v.toFixed(digitsFor(step));
  }
  function fmtPct(v, step) {
    return (v * 100).toFixed(step === undefined ? 2 : digitsFor(step * 100)) + ' %';
  }
  function fmtMs(v, step) {
    return v.toFixed(step === undefined ? (v < 10 ? 2 : 1) : digitsFor(step)) + ' ms';
  }
  function fmtBytes(v) {
    return fmtSI(v, 'B');
  }
  function pad2(n) {
    return (n < 10 ? '0' : '') + n;
  }
  function fmtClock(ms, seconds) {
    const d = new Date(ms);
    const s = pad2(d.getHours()) + ':' + pad2(d.getMinutes());
    return seconds ? s + ':' + pad2(d.getSeconds()) : s;
  }
  function fmtAgo(ms) {
    if (!(ms >= 0)) return '';
    if (ms < 1000) return ms + ' ms';
    if (ms < 120000) return (ms / 1000).toFixed(1) + ' s';
    return Math.round(ms / 60000) + ' min';
  }

  // ---- records -------------------------------------------------------

  function push(cols, row) {
    for (const k of cols.names) cols[k].push(row[k]);
    cols.n++;
    if (cols.n > MAX_POINTS) thin(cols);
  }

  // thin halves cols, keeping the newest point and every other one before it.
  function thin(cols) {
    const keep = [];
    for (let i = cols.n - 1; i >= 0; i -= 2) keep.push(i);
    keep.reverse();
    for (const k of cols.names) {
      const a = cols[k];
      cols[k] = keep.map((i) => a[i]);
    }
    cols.n = keep.length;
  }

  function reset() {
    state.since = 0;
    state.totalSteps = 0;
    state.codec = '';
    state.steps = columns(state.steps.names);
    state.evals = columns(state.evals.names);
    state.events = [];
  }

  function ingest(records) {
    for (const r of records) {
      const t = Date.parse(r.time);
      switch (r.kind) {
        case 'step':
          push(state.steps, {
            step: num0(r.step), t,
            loss: num(r.loss), rate: num(r.samples_per_s),
            compute: num0(r.compute_s), allreduce: num0(r.allreduce_s), wait: num0(r.wait_s),
            bytes: num0(r.bytes_sent),
          });
          if (r.steps) state.totalSteps = r.steps;
          if (r.codec) state.codec = r.codec;
          break;
        case 'eval':
          push(state.evals, {
            step: num0(r.step), t,
            acc: num(r.accuracy), bpb: num(r.bits_per_byte), testLoss: num(r.test_loss),
          });
          break;
        case 'event':
          state.events.unshift(r);
          break;
      }
    }
    if (state.events.length > MAX_EVENTS) state.events.length = MAX_EVENTS;
  }

  // ---- polling -------------------------------------------------------

  async function getJSON(path) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const resp = await fetch(path, { cache: 'no-store', signal: ctl.signal });
      if (!resp.ok) throw new Error(path + ': HTTP ' + resp.status);
      return await resp.json();
    } catch (e) {
      throw new Error(path + ': ' + (e && e.name === 'AbortError' ? 'no answer within ' + FETCH_TIMEOUT_MS / 1000 + ' s' : (e && e.message) || e));
    } finally {
      clearTimeout(timer);
    }
  }

  async function poll() {
    try {
      const [hist, status] = await Promise.all([
        getJSON('/history?since=' + state.since),
        getJSON('/status'),
      ]);
      const last = num(hist && hist.last);
      if (!(last >= 0)) throw new Error('/history: no record number in the answer');
      if (last < state.since) {
        // The peer restarted: its history starts again from 1.
        reset();
        setTimeout(poll, 0);
        return;
      }
      ingest(Array.isArray(hist.records) ? hist.records : []);
      state.since = last;
      state.status = status;
      state.lastOK = Date.now();
      state.error = '';
    } catch (e) {
      state.error = String((e && e.message) || e);
    }
    render();
    setTimeout(poll, POLL_MS);
  }

  // ---- SVG helpers -----------------------------------------------------

  function svgEl(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) {
      if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    }
    if (parent) parent.appendChild(e);
    return e;
  }
  function svgText(x, y, text, attrs, parent) {
    const e = svgEl('text', Object.assign({ x, y }, attrs || {}), parent);
    e.textContent = text;
    return e;
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  // frame sizes svg to its laid-out size and returns [width, height].
  function frame(svg) {
    const w = Math.max(200, Math.round(svg.clientWidth || 400));
    const h = Math.max(100, Math.round(svg.clientHeight || 200));
    svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
    clear(svg);
    return [w, h];
  }
  function fix(v) {
    return Math.round(v * 10) / 10;
  }

  // ---- scales and ticks ------------------------------------------------

  // niceTicks returns about n round values covering [lo, hi] and their step.
  function niceTicks(lo, hi, n) {
    const raw = (hi - lo) / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const r = raw / mag;
    const step = (r >= 7.5 ? 10 : r >= 3.5 ? 5 : r >= 1.5 ? 2 : 1) * mag;
    const values = [];
    for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9 && values.length < 50; v += step) {
      values.push(Number(v.toPrecision(12)));
    }
    return { step, values };
  }

  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);

  // timeTicks returns about n clock-aligned instants (ms) in [lo, hi].
  function timeTicks(lo, hi, n) {
    const raw = (hi - lo) / Math.max(1, n);
    const step = TIME_STEPS.find((s) => s >= raw) || TIME_STEPS[TIME_STEPS.length - 1];
    const tz = new Date(lo).getTimezoneOffset() * 60000;
    const values = [];
    for (let v = Math.ceil((lo - tz) / step) * step + tz; v <= hi && values.length < 50; v += step) values.push(v);
    return { step, values };
  }

  function domain(lo, hi, zero) {
    if (zero) { lo = Math.min(lo, 0); hi = Math.max(hi, 0); }
    if (!(lo < hi)) {
      const d = lo === 0 ? 1 : Math.abs(lo) * 0.1;
      return [lo - d, hi + d];
    }
    const pad = (hi - lo) * 0.05;
    return [zero && lo === 0 ? 0 : lo - pad, hi + pad];
  }

  // ---- decimation -------------------------------------------------------

  // decimate returns the indices of px (ascending pixel x of points i in
  // idx) to draw: all of them when there are few, otherwise per pixel
  // column the first, lowest, highest and last point, in order, so that
  // spikes survive.
  function decimate(idx, px, py, width) {
    if (idx.length <= 2 * width) return idx;
    const out = [];
    let col = NaN, first = -1, lo = -1, hi = -1, last = -1;
    const flush = () => {
      if (first < 0) return;
      const picks = [first, lo, hi, last].sort((a, b) => a - b);
      for (let k = 0; k < picks.length; k++) if (k === 0 || picks[k] !== picks[k - 1]) out.push(idx[picks[k]]);
    };
    for (let k = 0; k < idx.length; k++) {
      const c = Math.floor(px[k]);
      if (c !== col) {
        flush();
        col = c; first = lo = hi = last = k;
        continue;
      }
      last = k;
      if (py[k] < py[lo]) lo = k;
      if (py[k] > py[hi]) hi = k;
    }
    flush();
    return out;
  }

  // ---- charts ------------------------------------------------------------

  // movingMean returns the centred moving mean of ys over about 1/40 of
  // its points (at least 3), ignoring values that are not finite; too few
  // points give no mean (all NaN).
  function movingMean(ys) {
    const n = ys.length, out = new Array(n).fill(NaN);
    if (n < 20) return out;
    const half = Math.max(1, Math.round(n / 80));
    const sum = [0], cnt = [0];
    for (let i = 0; i < n; i++) {
      const ok = isFinite(ys[i]);
      sum.push(sum[i] + (ok ? ys[i] : 0));
      cnt.push(cnt[i] + (ok ? 1 : 0));
    }
    for (let i = 0; i < n; i++) {
      if (!isFinite(ys[i])) continue;
      const a = Math.max(0, i - half), b = Math.min(n, i + half + 1);
      out[i] = (sum[b] - sum[a]) / (cnt[b] - cnt[a]);
    }
    return out;
  }

  const hovers = new Map(); // svg id -> {xs: pixel x, label(i)}

  // plot draws a chart. spec: {svg, xs: the x of every row, series: [{id,
  // ys, kind: 'line'|'dots'}], stack: [{id, ys}] (areas stacked bottom up),
  // zero: include 0 on the y axis, fmtY(v, step), label(i): hover text of row i,
  // empty: text when there is nothing to draw}.
  function plot(spec) {
    const svg = spec.svg;
    const [w, h] = frame(svg);
    const x0 = MARGIN.left, x1 = w - MARGIN.right, y0 = h - MARGIN.bottom;
    let y1 = MARGIN.top;
    const stack = spec.stack || [];
    const lines = spec.series || [];

    // The finite rows of each series, and the domain over all of them.
    let xlo = Infinity, xhi = -Infinity, ylo = Infinity, yhi = -Infinity;
    const rows = [];
    for (const s of lines) {
      const xs = s.xs || spec.xs, r = [];
      for (let i = 0; i < s.ys.length; i++) {
        if (isFinite(xs[i]) && isFinite(s.ys[i])) {
          r.push(i);
          xlo = Math.min(xlo, xs[i]); xhi = Math.max(xhi, xs[i]);
          ylo = Math.min(ylo, s.ys[i]); yhi = Math.max(yhi, s.ys[i]);
        }
      }
      rows.push(r);
    }
    let stackRows = [], tops = [];
    if (stack.length) {
      const xs = spec.xs;
      for (let i = 0; i < xs.length; i++) {
        let sum = 0, ok = isFinite(xs[i]);
        for (const s of stack) { if (isFinite(s.ys[i])) sum += Math.max(0, s.ys[i]); else ok = false; }
        if (!ok) continue;
        stackRows.push(i); tops.push(sum);
        xlo = Math.min(xlo, xs[i]); xhi = Math.max(xhi, xs[i]);
        ylo = Math.min(ylo, 0); yhi = Math.max(yhi, sum);
      }
    }
    const count = rows.reduce((a, r) => a + r.length, 0) + stackRows.length;
    // A robust chart caps its y axis above rare outliers (the first step's
    // wait for the ring, a stall) so that the usual values stay readable;
    // what lies above is drawn at the top edge and the maximum is noted.
    let clipped = NaN;
    if (spec.robust) {
      const vals = stack.length ? tops.slice() : [];
      lines.forEach((s, k) => { for (const i of rows[k]) vals.push(s.ys[i]); });
      if (vals.length >= 20) {
        vals.sort((a, b) => a - b);
        const q = vals[Math.floor(0.99 * (vals.length - 1))];
        if (q > 0 && yhi > 3 * q) { clipped = yhi; yhi = 1.5 * q; y1 += 12; }
      }
    }
    const time = state.xMode === 'time';

    if (!count) {
      svgText((x0 + x1) / 2, (y0 + y1) / 2, spec.empty || 'no data yet', { class: 'empty' }, svg);
      for (const s of lines) emptySeries(svg, s);
      for (const s of stack) svgEl('polygon', { id: s.id, class: 'area', 'data-points': 0, 'data-drawn': 0 }, svg);
      hovers.delete(svg.id);
      return;
    }

    const [dxlo, dxhi] = xlo < xhi ? [xlo, xhi] : [xlo - 1, xhi + 1];
    const [dylo, dyhi] = domain(ylo, yhi, spec.zero);
    const sx = (v) => x0 + (v - dxlo) / (dxhi - dxlo) * (x1 - x0);
    const sy = (v) => y0 - (Math.min(Math.max(v, dylo), dyhi) - dylo) / (dyhi - dylo) * (y0 - y1);

    // Grid, axes and tick labels.
    const yt = niceTicks(dylo, dyhi, Math.max(2, Math.round((y0 - y1) / 40)));
    for (const v of yt.values) {
      const y = fix(sy(v));
      svgEl('line', { class: 'gridline', x1: x0, x2: x1, y1: y, y2: y }, svg);
      svgText(x0 - 6, y + 3, (spec.fmtY || fmtTick)(v, yt.step), { 'text-anchor': 'end' }, svg);
    }
    const nx = Math.max(2, Math.round((x1 - x0) / 90));
    const xt = time ? timeTicks(dxlo, dxhi, nx) : niceTicks(dxlo, dxhi, nx);
    for (const v of xt.values) {
      if (!time && v !== Math.round(v)) continue; // steps are whole
      const x = fix(sx(v));
      svgEl('line', { class: 'axis', x1: x, x2: x, y1: y0, y2: y0 + 4 }, svg);
      svgText(x, y0 + 15, time ? fmtClock(v, xt.step < 60000) : fmtTick(v, 1), { 'text-anchor': 'middle' }, svg);
    }
    svgEl('line', { class: 'axis', x1: x0, x2: x1, y1: y0, y2: y0 }, svg);
    svgEl('line', { class: 'axis', x1: x0, x2: x0, y1: y1, y2: y0 }, svg);
    if (isFinite(clipped)) {
      svgText(x1, y1 - 6, 'clipped above the axis: max ' + (spec.fmtY || fmtSI)(clipped), { class: 'note', 'text-anchor': 'end' }, svg);
    }

    // Stacked areas: per drawn column the mean of each component.
    if (stack.length) drawStack(svg, spec, stack, stackRows, sx, sy, x1 - x0);
    // Lines and dots.
    lines.forEach((s, k) => drawSeries(svg, s, s.xs || spec.xs, rows[k], sx, sy, x1 - x0));

    // Hover: the row nearest the pointer along x, in the first series (or the stack).
    const hx = stack.length ? stackRows : rows[0] || [];
    const xs = (lines[0] && lines[0].xs) || spec.xs;
    hovers.set(svg.id, { px: hx.map((i) => sx(xs[i])), rows: hx, label: spec.label, top: y1, bottom: y0 });
  }

  function seriesClass(s) {
    return 'series' + (s.cls ? ' ' + s.cls : '');
  }

  function emptySeries(svg, s) {
    if (s.kind === 'dots') svgEl('g', { id: s.id, 'data-points': 0, 'data-drawn': 0 }, svg);
    else svgEl('polyline', { id: s.id, class: seriesClass(s), points: '', 'data-points': 0, 'data-drawn': 0 }, svg);
  }

  function drawSeries(svg, s, xs, rows, sx, sy, width) {
    const px = rows.map((i) => sx(xs[i])), py = rows.map((i) => sy(s.ys[i]));
    const pos = new Map(rows.map((i, k) => [i, k]));
    const keep = decimate(rows, px, py, width);
    if (s.kind === 'dots') {
      const g = svgEl('g', { id: s.id, 'data-points': rows.length, 'data-drawn': keep.length }, svg);
      for (const i of keep) {
        const k = pos.get(i);
        svgEl('circle', { cx: fix(px[k]), cy: fix(py[k]), r: keep.length > 200 ? 1.5 : 2.5 }, g);
      }
      return;
    }
    const pts = keep.map((i) => { const k = pos.get(i); return fix(px[k]) + ',' + fix(py[k]); }).join(' ');
    svgEl('polyline', { id: s.id, class: seriesClass(s), points: pts, 'data-points': rows.length, 'data-drawn': keep.length }, svg);
  }

  function drawStack(svg, spec, stack, rows, sx, sy, width) {
    // Columns of rows: one per pixel when there are many rows.
    const cols = [];
    if (rows.length <= 2 * width) {
      for (const i of rows) cols.push([i]);
    } else {
      let c = NaN;
      for (const i of rows) {
        const p = Math.floor(sx(spec.xs[i]));
        if (p !== c) { cols.push([]); c = p; }
        cols[cols.length - 1].push(i);
      }
    }
    const mean = (col, f) => col.reduce((a, i) => a + f(i), 0) / col.length;
    const xs = cols.map((col) => fix(sx(mean(col, (i) => spec.xs[i]))));
    let base = cols.map(() => 0);
    for (const s of stack) {
      const top = cols.map((col, k) => base[k] + mean(col, (i) => Math.max(0, s.ys[i])));
      const upper = xs.map((x, k) => x + ',' + fix(sy(top[k])));
      const lower = xs.map((x, k) => x + ',' + fix(sy(base[k]))).reverse();
      if (xs.length === 1) { // a single step: a bar a few pixels wide
        upper.push((xs[0] + 3) + ',' + fix(sy(top[0])));
        lower.unshift((xs[0] + 3) + ',' + fix(sy(base[0])));
      }
      svgEl('polygon', { id: s.id, class: 'area', points: upper.concat(lower).join(' '), 'data-points': rows.length, 'data-drawn': cols.length }, svg);
      base = top;
    }
  }

  function onHover(ev) {
    const svg = ev.currentTarget;
    const hv = hovers.get(svg.id);
    const old = svg.querySelector('g.hover');
    if (old) old.remove();
    if (!hv || !hv.px.length || ev.type === 'mouseleave' || !hv.label) return;
    const rect = svg.getBoundingClientRect();
    const vb = svg.viewBox.baseVal;
    const x = (ev.clientX - rect.left) * (vb && vb.width ? vb.width / rect.width : 1);
    // Binary search for the nearest pixel x.
    let lo = 0, hi = hv.px.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (hv.px[mid] < x) lo = mid + 1; else hi = mid; }
    if (lo > 0 && Math.abs(hv.px[lo - 1] - x) < Math.abs(hv.px[lo] - x)) lo--;
    const px = fix(hv.px[lo]);
    const g = svgEl('g', { class: 'hover' }, svg);
    svgEl('line', { x1: px, x2: px, y1: hv.top, y2: hv.bottom }, g);
    const r = svgEl('rect', { rx: 3 }, g);
    const t = svgText(0, hv.top + 14, hv.label(hv.rows[lo]), {}, g);
    const tw = t.getComputedTextLength();
    const w = vb && vb.width ? vb.width : rect.width;
    const tx = Math.min(Math.max(px + 8, MARGIN.left + 4), w - tw - 8);
    t.setAttribute('x', fix(px + 8 + tw + 8 > w ? px - tw - 8 : tx));
    r.setAttribute('x', fix(Number(t.getAttribute('x')) - 4));
    r.setAttribute('y', hv.top + 2);
    r.setAttribute('width', fix(tw + 8));
    r.setAttribute('height', 16);
  }

  function xLabel(step, t) {
    return state.xMode === 'time' ? fmtClock(t, true) + ' (step ' + step + ')' : 'step ' + step;
  }

  function renderCharts() {
    const S = state.steps, E = state.evals;
    const sx = state.xMode === 'time' ? S.t : S.step;
    const ex = state.xMode === 'time' ? E.t : E.step;
    const gpt = E.bpb.some((v) => isFinite(v));

    plot({
      svg: $('chart-loss'), xs: sx,
      series: [
        { id: 'series-loss', ys: S.loss, kind: 'line', cls: 'raw' },
        { id: 'series-loss-mean', ys: movingMean(S.loss), kind: 'line', cls: 'mean' },
        { id: 'series-testloss-dots', ys: E.testLoss, xs: ex, kind: 'dots' },
      ],
      label: (i) => xLabel(S.step[i], S.t[i]) + ': loss ' + fmtSI(S.loss[i]),
      empty: 'no steps yet',
    });

    $('eval-title').textContent = gpt ? 'Held-out bits per byte' : 'Test accuracy';
    $('tile-eval-label').textContent = gpt ? 'bits per byte' : 'test accuracy';
    const ey = gpt ? E.bpb : E.acc;
    plot({
      svg: $('chart-eval'), xs: ex,
      series: [
        { id: 'series-eval', ys: ey, kind: 'line' },
        { id: 'series-eval-dots', ys: ey, kind: 'dots' },
      ],
      fmtY: gpt ? fmtTick : fmtPct,
      label: (i) => xLabel(E.step[i], E.t[i]) + ': ' + (gpt ? fmtSI(E.bpb[i]) + ' bits/byte' : fmtPct(E.acc[i])) + ', test loss ' + fmtSI(E.testLoss[i]),
      empty: 'no evaluation yet',
    });

    plot({
      svg: $('chart-rate'), xs: sx, zero: true, robust: true,
      series: [
        { id: 'series-rate', ys: S.rate, kind: 'line', cls: 'raw' },
        { id: 'series-rate-mean', ys: movingMean(S.rate), kind: 'line', cls: 'mean' },
      ],
      label: (i) => xLabel(S.step[i], S.t[i]) + ': ' + fmtSI(S.rate[i]) + ' samples/s',
      empty: 'no steps yet',
    });

    const ms = (a) => a.map((v) => v * 1000);
    const compute = ms(S.compute), allreduce = ms(S.allreduce), wait = ms(S.wait);
    plot({
      svg: $('chart-time'), xs: sx, zero: true, robust: true, fmtY: fmtMs,
      stack: [
        { id: 'series-compute', ys: compute },
        { id: 'series-allreduce', ys: allreduce },
        { id: 'series-wait', ys: wait },
      ],
      label: (i) => xLabel(S.step[i], S.t[i]) + ': compute ' + fmtMs(compute[i]) + ', all-reduce ' + fmtMs(allreduce[i]) + ', waiting ' + fmtMs(wait[i]),
      empty: 'no steps yet',
    });

    plot({
      svg: $('chart-bytes'), xs: sx, zero: true, robust: true, fmtY: fmtBytes,
      series: [
        { id: 'series-bytes', ys: S.bytes, kind: 'line', cls: 'raw' },
        { id: 'series-bytes-mean', ys: movingMean(S.bytes), kind: 'line', cls: 'mean' },
      ],
      label: (i) => xLabel(S.step[i], S.t[i]) + ': ' + fmtBytes(S.bytes[i]),
      empty: 'no steps yet',
    });
  }

  // ---- the ring ----------------------------------------------------------

  function shortID(id) {
    return id && id.length > 10 ? '…' + id.slice(-6) : id || '?';
  }
  function memberNames(st) {
    const names = new Map();
    for (const m of (st && st.members) || []) names.set(m.peer_id, m.name || shortID(m.peer_id));
    return names;
  }

  function renderRing() {
    const svg = $('ring');
    const [w, h] = frame(svg);
    const st = state.status;
    const ring = (st && st.ring) || {};
    const order = Array.isArray(ring.order) ? ring.order : [];
    const info = $('ring-info');
    const trainer = st && st.trainer_waiting ? 'trainer waiting ' + st.trainer_waiting : '';
    if (!order.length) {
      info.textContent = [ring.waiting ? 'no ring epoch: ' + ring.waiting : 'no ring epoch yet', trainer].filter(Boolean).join(' · ');
      svgText(w / 2, h / 2, 'no ring yet', { class: 'empty' }, svg);
      return;
    }
    const parts = ['epoch ' + ring.epoch, order.length + (order.length === 1 ? ' member' : ' members'), 'from step ' + (ring.start_step || 0)];
    if (ring.schedule) parts.push('schedule ' + ring.schedule);
    if (ring.final_codec) parts.push('all-gather ' + ring.final_codec);
    if (ring.waiting) parts.push('waiting: ' + ring.waiting);
    if (trainer) parts.push(trainer);
    info.textContent = parts.join(' · ');

    const self = st.peer_id;
    const names = memberNames(st);
    const links = new Map(((st && st.links) || []).map((l) => [l.peer, l]));
    // Every member gossips the links it sends on: the others' come from
    // their member entries.
    const memberLinks = new Map(((st && st.members) || []).map((m) => [m.peer_id, new Map((m.links || []).map((l) => [l.peer, l]))]));
    const n = order.length;
    // Members go clockwise from the top; the circle's radius and centre
    // fit the members' extent between room above the top one (for the
    // coordinator's mark) and below the lowest (for its name).
    const nodeR = n > 12 ? 9 : 15;
    const angles = order.map((_, k) => -Math.PI / 2 + 2 * Math.PI * k / n);
    const lo = Math.min(...angles.map(Math.sin)), hi = Math.max(...angles.map(Math.sin));
    const top = 24, bottom = h - 34;
    const R = n === 1 ? 0 : Math.max(30, Math.min(w / 2 - 80, (bottom - top) / (hi - lo)));
    const cx = w / 2, cy = n === 1 ? h / 2 : top - R * lo;
    const pos = angles.map((a) => [cx + R * Math.cos(a), cy + R * Math.sin(a)]);

    const defs = svgEl('defs', {}, svg);
    for (const id of ['ring-arrow', 'ring-arrow-measured']) {
      const m = svgEl('marker', { id, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' }, defs);
      svgEl('path', { d: 'M0,0 L10,5 L0,10 z' }, m);
    }

    const codecs = Array.isArray(ring.link_codecs) ? ring.link_codecs : [];
    const runCodec = (st && st.codec) || state.codec;
    if (n > 1) {
      for (let k = 0; k < n; k++) {
        const from = order[k], to = order[(k + 1) % n];
        const [ax, ay] = pos[k], [bx, by] = pos[(k + 1) % n];
        const dx = bx - ax, dy = by - ay, len = Math.hypot(dx, dy) || 1;
        // Bow outwards (to the left of the direction of travel, which is
        // away from the centre for a clockwise ring), more for two members
        // so that their two links do not overlap.
        const bow = len * (n === 2 ? 0.42 : 0.12);
        const qx = (ax + bx) / 2 + dy / len * bow, qy = (ay + by) / 2 - dx / len * bow;
        const toward = (px, py, tx, ty, d) => { const l = Math.hypot(tx - px, ty - py) || 1; return [px + (tx - px) / l * d, py + (ty - py) / l * d]; };
        const [sx, sy] = toward(ax, ay, qx, qy, nodeR + 3);
        const [ex, ey] = toward(bx, by, qx, qy, nodeR + 4);
        const fig = from === self ? links.get(to) : (memberLinks.get(from) || new Map()).get(to);
        const measured = fig && isFinite(fig.mbit_s);
        const codec = codecs[k] || runCodec || '';
        const path = svgEl('path', {
          class: 'ring-link' + (measured ? ' measured' : ''),
          d: 'M' + fix(sx) + ',' + fix(sy) + ' Q' + fix(qx) + ',' + fix(qy) + ' ' + fix(ex) + ',' + fix(ey),
          'marker-end': 'url(#' + (measured ? 'ring-arrow-measured' : 'ring-arrow') + ')',
          'data-from': from, 'data-to': to, 'data-codec': codec,
          'data-mbit-s': measured ? fig.mbit_s : undefined,
        }, svg);
        const speed = measured ? fmtSI(fig.mbit_s * 1e6, 'bit/s') : 'not measured yet';
        const tip = svgEl('title', {}, path);
        tip.textContent = (names.get(from) || shortID(from)) + ' → ' + (names.get(to) || shortID(to)) + ': ' + speed +
          (measured && isFinite(fig.rtt_ms) ? ', rtt ' + fig.rtt_ms.toFixed(2) + ' ms' : '') + (codec ? ', codec ' + codec : '') +
          (measured ? '' : ' (each peer measures the links it sends on, in the background)');
        if (n <= 12) {
          // The label (speed, then codec; links not measured yet show the
          // codec only) sits by the curve's midpoint: outside a steep link,
          // above a flat one (inside the ring for a link along the bottom,
          // whose nodes have their names below them).
          const mx = 0.25 * sx + 0.5 * qx + 0.25 * ex, my = 0.25 * sy + 0.5 * qy + 0.25 * ey;
          const flat = Math.abs(dy) < len * 0.3;
          const lines = [];
          if (measured) lines.push([fmtSI(fig.mbit_s * 1e6, 'bit/s'), '']);
          if (codec) lines.push([codec, 'codec']);
          const ox = flat ? mx : mx + dy / len * 12;
          const oy = flat ? my - 6 - 12 * (lines.length - 1) : my - dx / len * 12;
          const anchor = flat ? 'middle' : (dy > 0 ? 'start' : 'end');
          const t = svgText(fix(ox), fix(oy), '', { class: 'link-label', 'text-anchor': anchor }, svg);
          lines.forEach(([text, cls], i) => {
            const span = svgEl('tspan', { x: fix(ox), dy: i ? 12 : 0, class: cls || undefined }, t);
            span.textContent = text;
          });
        }
      }
    }

    order.forEach((id, k) => {
      const [x, y] = pos[k];
      const cls = ['ring-node'];
      if (id === self) cls.push('self');
      if (id === ring.coordinator) cls.push('coordinator');
      const g = svgEl('g', { class: cls.join(' '), 'data-peer': id, 'data-rank': k, transform: 'translate(' + fix(x) + ',' + fix(y) + ')' }, svg);
      const tip = svgEl('title', {}, g);
      tip.textContent = (names.get(id) || '') + ' ' + id + (id === ring.coordinator ? ' (coordinator)' : '') + (id === self ? ' (this peer)' : '');
      if (id === ring.coordinator) svgEl('circle', { class: 'coord', r: nodeR + 4 }, g);
      svgEl('circle', { class: 'dot', r: nodeR }, g);
      svgText(0, 0, String(k), { class: 'rank' }, g);
      // The name below the node (its roles are in the tooltip and the
      // members table; the drawing marks them).
      svgText(0, nodeR + (id === ring.coordinator ? 16 : 13), names.get(id) || shortID(id), { class: 'name' }, g);
    });
  }

  // ---- tables ------------------------------------------------------------

  function cell(tr, text, cls, title) {
    const td = document.createElement('td');
    td.textContent = text;
    if (cls) td.className = cls;
    if (title) td.title = title;
    tr.appendChild(td);
    return td;
  }

  function renderMembers() {
    const st = state.status;
    const body = $('members').tBodies[0];
    clear(body);
    const members = ((st && st.members) || []).slice();
    const order = (st && st.ring && st.ring.order) || [];
    const rank = new Map(order.map((id, k) => [id, k]));
    members.sort((a, b) => (rank.has(a.peer_id) ? rank.get(a.peer_id) : 1e9) - (rank.has(b.peer_id) ? rank.get(b.peer_id) : 1e9) ||
      String(a.name).localeCompare(String(b.name)) || String(a.peer_id).localeCompare(String(b.peer_id)));
    if (!members.length) {
      const tr = document.createElement('tr');
      cell(tr, 'no members known yet', 'muted').colSpan = 7;
      body.appendChild(tr);
      return;
    }
    for (const m of members) {
      const tr = document.createElement('tr');
      tr.dataset.peer = m.peer_id;
      if (m.peer_id === st.peer_id) tr.className = 'self';
      cell(tr, m.name || '—');
      cell(tr, shortID(m.peer_id), 'peer', m.peer_id);
      cell(tr, m.state, 'state-' + m.state);
      cell(tr, String(m.step), 'num');
      cell(tr, m.peer_id === st.peer_id || !(m.last_seen_ms >= 0) ? '—' : fmtAgo(m.last_seen_ms) + ' ago', 'num');
      cell(tr, rank.has(m.peer_id) ? '#' + rank.get(m.peer_id) : m.observer ? 'observer' : 'out');
      const notes = [];
      if (m.peer_id === st.peer_id) notes.push('this peer');
      if (st.ring && m.peer_id === st.ring.coordinator) notes.push('coordinator');
      if (m.excluded_for_ms > 0) notes.push('excluded ' + fmtAgo(m.excluded_for_ms) + ' more' + (m.excluded_for ? ': ' + m.excluded_for : ''));
      if (m.gossip_score < 0) notes.push('gossip score ' + m.gossip_score.toFixed(0));
      if (m.version && st.version && m.version !== st.version) notes.push('version ' + m.version);
      cell(tr, notes.join('; '), 'muted');
      body.appendChild(tr);
    }
  }

  const EVENT_NAMES = {
    epoch: 'epoch', member: 'member', step_failed: 'failed step', excluded: 'excluded',
    resync: 'resync', checkpoint: 'checkpoint', done: 'done',
  };

  function renderEvents() {
    const ol = $('events');
    clear(ol);
    const names = memberNames(state.status);
    if (!state.events.length) {
      const li = document.createElement('li');
      li.className = 'none';
      li.textContent = 'no events yet';
      ol.appendChild(li);
      return;
    }
    for (const r of state.events) {
      const li = document.createElement('li');
      li.className = 'event ev-' + String(r.event).replace(/[^a-z_]/g, '');
      li.dataset.event = r.event;
      const t = Date.parse(r.time);
      const when = document.createElement('span');
      when.className = 'when';
      when.textContent = isFinite(t) ? fmtClock(t, true) : '';
      const at = document.createElement('span');
      at.className = 'at';
      at.textContent = 'step ' + (r.step || 0);
      const what = document.createElement('span');
      what.className = 'what';
      const name = document.createElement('span');
      name.className = 'name';
      name.textContent = EVENT_NAMES[r.event] || r.event;
      what.appendChild(name);
      const text = [];
      if (r.peer) text.push((r.event === 'step_failed' ? 'blamed ' : '') + (names.get(r.peer) || shortID(r.peer)));
      if (r.msg) text.push(r.msg);
      what.appendChild(document.createTextNode(text.join(': ')));
      if (r.peer) what.title = r.peer;
      li.append(when, at, what);
      ol.appendChild(li);
    }
  }

  // ---- header and tiles --------------------------------------------------

  function lastFinite(a) {
    for (let i = a.length - 1; i >= 0; i--) if (isFinite(a[i])) return a[i];
    return NaN;
  }

  function renderTiles() {
    const st = state.status || {};
    const S = state.steps, E = state.evals;
    const step = st.step !== undefined ? st.step : lastFinite(S.step);
    $('tile-step').textContent = isFinite(step) ? step + (state.totalSteps ? ' / ' + state.totalSteps : '') : '—';
    const loss = st.loss !== undefined && st.loss !== null ? st.loss : lastFinite(S.loss);
    $('tile-loss').textContent = fmtSI(num(loss));
    const bpb = lastFinite(E.bpb);
    $('tile-eval').textContent = isFinite(bpb) ? bpb.toFixed(3) : isFinite(lastFinite(E.acc)) ? fmtPct(lastFinite(E.acc)) : '—';
    $('tile-rate').textContent = fmtSI(num(st.samples_per_s !== undefined ? st.samples_per_s : lastFinite(S.rate)));
    $('tile-bytes').textContent = fmtBytes(num(st.bytes_per_step !== undefined ? st.bytes_per_step : lastFinite(S.bytes)));
    const ring = st.ring || {};
    const peers = Array.isArray(ring.order) ? ring.order.length : 0;
    $('tile-ring').textContent = peers ? peers + (peers === 1 ? ' peer' : ' peers') : '—';
    $('tile-ring-label').textContent = peers ? 'ring · epoch ' + ring.epoch : 'ring';
    $('tile-codec').textContent = st.codec || state.codec || '—';
    $('tile-codec').title = $('tile-codec').textContent;
    $('tile-codec').classList.toggle('long', $('tile-codec').textContent.length > 12);

    if (state.status) {
      $('peer-name').textContent = st.name || shortID(st.peer_id);
      $('peer-name').title = st.peer_id || '';
      $('peer-meta').textContent = [st.cluster && 'cluster ' + st.cluster, st.version, st.peer_id].filter(Boolean).join(' · ');
      document.title = 'p2ptrain · ' + (st.name || shortID(st.peer_id));
    }
    const conn = $('conn');
    if (state.error) {
      conn.dataset.state = state.lastOK ? 'stale' : 'connecting';
      conn.textContent = state.lastOK ? 'no answer since ' + fmtClock(state.lastOK, true) : 'cannot reach the API';
      conn.title = state.error;
    } else if (state.lastOK) {
      conn.dataset.state = 'live';
      conn.textContent = 'live · ' + fmtClock(state.lastOK, true);
      conn.title = '';
    }
  }

  function render() {
    renderTiles();
    renderCharts();
    renderRing();
    renderMembers();
    renderEvents();
  }

  // ---- start -------------------------------------------------------------

  function setXMode(mode) {
    state.xMode = mode === 'time' ? 'time' : 'step';
    for (const b of document.querySelectorAll('.switch button')) b.setAttribute('aria-pressed', String(b.dataset.x === state.xMode));
    try { localStorage.setItem('p2ptrain.xmode', state.xMode); } catch (e) { /* storage off */ }
    renderCharts();
  }

  function start() {
    // ?x=time or ?x=step picks the x axis; otherwise the last choice made here.
    let saved = new URLSearchParams(location.search).get('x');
    if (!saved) {
      try { saved = localStorage.getItem('p2ptrain.xmode'); } catch (e) { /* storage off */ }
    }
    for (const b of document.querySelectorAll('.switch button')) b.addEventListener('click', () => setXMode(b.dataset.x));
    for (const svg of document.querySelectorAll('svg.chart')) {
      svg.addEventListener('mousemove', onHover);
      svg.addEventListener('mouseleave', onHover);
    }
    let resizing = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizing);
      resizing = setTimeout(render, 100);
    });
    setXMode(saved);
    render();
    poll();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
