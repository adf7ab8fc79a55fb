#!/usr/bin/env node
// ONNX Runtime (CPU, onnxruntime-node) peer for kiln's benchmark harness.
//
//   node bench/ort_bench.js [--threads T] [--warmup 5] [--runs 30] [--min-seconds 1]
//                           [--max-seconds 5] MODEL_DIR[@CLASS] ...
//
// MODEL_DIR is an examples/<name> directory (model.onnx, inputs/*.npy, outputs/*.npy), or a
// generated benchmark model's directory (bench/models.py: model.onnx only; a CLASS is required).
// CLASS is a shape class, e.g. `x=[4,64]` or `latent=[1,4,64,64];timestep=[1];cond=[1,64]`
// (inputs separated by `;` or `,`); without one, the reference inputs' shapes are used.
// `--class SPEC` applies to the MODEL_DIR arguments that follow it and carry no `@CLASS`.
//
// When the class equals the reference inputs' shapes, the reference inputs are fed and the
// outputs are checked against outputs/*.npy ("max_abs_err"); otherwise deterministic inputs are
// generated (genInput below; torch_bench.py generates the same values).
//
// Prints one JSON line per (model, class) on stdout. Memory numbers are per process: the driver
// (run.sh) runs one (model, class) per process so they are not mixed up.
'use strict';

const fs = require('fs');
const path = require('path');
const os = require('os');
const ort = require('onnxruntime-node');

// ------------------------------------------------------------------------------------------------
// .npy
// ------------------------------------------------------------------------------------------------

const NPY_DTYPES = {
  '<f4': { type: 'float32', ctor: Float32Array },
  '<f8': { type: 'float64', ctor: Float64Array },
  '<i8': { type: 'int64', ctor: BigInt64Array },
  '<i4': { type: 'int32', ctor: Int32Array },
  '|u1': { type: 'uint8', ctor: Uint8Array },
  '|b1': { type: 'bool', ctor: Uint8Array },
};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.readUInt32BE(0) !== 0x934e554d || buf.toString('latin1', 4, 6) !== 'PY') {
    throw new Error(`${file}: not a .npy file`);
  }
  const major = buf[6];
  let hlen, hstart;
  if (major === 1) { hlen = buf.readUInt16LE(8); hstart = 10; }
  else { hlen = buf.readUInt32LE(8); hstart = 12; }
  const header = buf.toString('latin1', hstart, hstart + hlen);
  const descr = /'descr':\s*'([^']+)'/.exec(header);
  const fortran = /'fortran_order':\s*(True|False)/.exec(header);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) throw new Error(`${file}: bad header ${header}`);
  if (fortran[1] === 'True') throw new Error(`${file}: fortran order not supported`);
  const dt = NPY_DTYPES[descr[1]];
  if (!dt) throw new Error(`${file}: dtype ${descr[1]} not supported`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const count = dims.reduce((a, b) => a * b, 1);
  const off = hstart + hlen;
  const bytes = buf.buffer.slice(buf.byteOffset + off,
                                 buf.byteOffset + off + count * dt.ctor.BYTES_PER_ELEMENT);
  return { type: dt.type, dims, data: new dt.ctor(bytes) };  // copy: aligned
}

// ------------------------------------------------------------------------------------------------
// Shape classes and deterministic inputs (must match torch_bench.py)
// ------------------------------------------------------------------------------------------------

// "x=[4,64]" / "a=[1,2];b=[3]" / "a=[1,2],b=[3]" -> [[name, [dims]], ...] in the order given.
function parseClass(spec) {
  const out = [];
  const re = /([A-Za-z_][\w.:/-]*)\s*=\s*\[([^\]]*)\]/g;
  let m;
  let rest = spec;
  while ((m = re.exec(spec)) !== null) {
    const dims = m[2].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
    if (dims.some((d) => !Number.isInteger(d) || d < 0)) throw new Error(`bad class ${spec}`);
    out.push([m[1], dims]);
    rest = rest.replace(m[0], '');
  }
  if (!out.length || /[^\s,;]/.test(rest)) throw new Error(`bad shape class: ${spec}`);
  return out;
}

function formatClass(pairs) {
  return pairs.map(([n, d]) => `${n}=[${d.join(',')}]`).join(';');
}

// FNV-1a of the input name: the seed of its generator.
function fnv1a(s) {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

// mulberry32: a 32-bit generator that is easy to replicate bit-for-bit in Python.
function mulberry32(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1) >>> 0;
    t = (t ^ (t + Math.imul(t ^ (t >>> 7), t | 61))) >>> 0;
    return (t ^ (t >>> 14)) >>> 0;
  };
}

// float: uniform in [-1, 1) as (u >> 8) / 2^23 - 1 (exact in float32); int64: u % 512.
function genInput(name, type, dims) {
  const count = dims.reduce((a, b) => a * b, 1);
  const next = mulberry32(fnv1a(name));
  if (type === 'float32') {
    const a = new Float32Array(count);
    for (let i = 0; i < count; i++) a[i] = (next() >>> 8) / 8388608 - 1;
    return a;
  }
  if (type === 'int64') {
    const a = new BigInt64Array(count);
    for (let i = 0; i < count; i++) a[i] = BigInt(next() % 512);
    return a;
  }
  if (type === 'int32') {
    const a = new Int32Array(count);
    for (let i = 0; i < count; i++) a[i] = next() % 512;
    return a;
  }
  throw new Error(`cannot generate input ${name} of type ${type}`);
}

// ------------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------------

function vmHwmMb() {
  try {
    const m = /VmHWM:\s+(\d+)\s+kB/.exec(fs.readFileSync('/proc/self/status', 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch (e) {
    return null;
  }
}

// ------------------------------------------------------------------------------------------------
// Bench
// ------------------------------------------------------------------------------------------------

function percentile(sorted, p) {
  // nearest-rank on sorted samples; p in [0, 100]
  const k = Math.max(0, Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[k];
}

function median(sorted) {
  const n = sorted.length;
  return n % 2 ? sorted[(n - 1) >> 1] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

const round = (x, d = 4) => (x === null || x === undefined ? x : Number(x.toFixed(d)));

async function benchOne(modelDir, classSpec, opt) {
  const model = path.basename(path.resolve(modelDir));
  const onnxPath = path.join(modelDir, 'model.onnx');

  // Reference inputs / outputs.
  const refIn = {};
  const inDir = path.join(modelDir, 'inputs');
  // A generated benchmark model (bench/models.py) has no reference inputs: only classes.
  const inFiles = fs.existsSync(inDir) ? fs.readdirSync(inDir).sort() : [];
  for (const f of inFiles) {
    if (f.endsWith('.npy')) refIn[f.slice(0, -4)] = readNpy(path.join(inDir, f));
  }
  const refOut = {};
  const outDir = path.join(modelDir, 'outputs');
  if (fs.existsSync(outDir)) {
    for (const f of fs.readdirSync(outDir).sort()) {
      if (f.endsWith('.npy')) refOut[f.slice(0, -4)] = readNpy(path.join(outDir, f));
    }
  }

  if (global.gc) global.gc();
  const rssBase = process.memoryUsage().rss / 1048576;
  let rssPeak = rssBase;
  const sample = () => { rssPeak = Math.max(rssPeak, process.memoryUsage().rss / 1048576); };

  const session = await ort.InferenceSession.create(onnxPath, {
    executionProviders: ['cpu'],
    intraOpNumThreads: opt.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
  });
  sample();

  // Input shapes: the class, or the reference inputs' shapes.
  const meta = {};
  for (const m of session.inputMetadata) meta[m.name] = m;
  let pairs;
  if (classSpec) {
    pairs = parseClass(classSpec);
  } else {
    pairs = session.inputNames.map((n) => [n, refIn[n].dims]);
  }
  const given = new Set(pairs.map(([n]) => n));
  for (const n of session.inputNames) {
    if (!given.has(n)) throw new Error(`${model}: class ${classSpec} lacks input ${n}`);
  }
  // Order as the graph declares its inputs (the class key is order-independent).
  const byName = Object.fromEntries(pairs);
  pairs = session.inputNames.map((n) => [n, byName[n]]);
  const isRef = pairs.every(([n, d]) => refIn[n] &&
      refIn[n].dims.length === d.length && refIn[n].dims.every((x, i) => x === d[i]));

  const feeds = {};
  for (const [n, dims] of pairs) {
    const type = (meta[n] && meta[n].type) || (refIn[n] && refIn[n].type) || 'float32';
    const data = isRef ? refIn[n].data : genInput(n, type, dims);
    feeds[n] = new ort.Tensor(type, data, dims);
  }

  // Correctness on the reference inputs.
  let maxAbsErr = null;
  const first = await session.run(feeds);
  sample();
  if (isRef && Object.keys(refOut).length) {
    maxAbsErr = 0;
    for (const [n, ref] of Object.entries(refOut)) {
      const got = first[n];
      if (!got) throw new Error(`${model}: ORT produced no output ${n}`);
      if (got.data.length !== ref.data.length) throw new Error(`${model}: ${n} size mismatch`);
      for (let i = 0; i < ref.data.length; i++) {
        const e = Math.abs(Number(got.data[i]) - Number(ref.data[i]));
        if (Number.isNaN(e)) maxAbsErr = Infinity;
        else if (e > maxAbsErr) maxAbsErr = e;
      }
    }
  }

  for (let i = 0; i < opt.warmup; i++) { await session.run(feeds); sample(); }

  const times = [];
  const t0 = process.hrtime.bigint();
  for (;;) {
    const a = process.hrtime.bigint();
    await session.run(feeds);
    const b = process.hrtime.bigint();
    times.push(Number(b - a) / 1e6);
    sample();
    const elapsed = Number(b - t0) / 1e9;
    if (times.length >= opt.maxRuns) break;
    if (elapsed >= opt.maxSeconds && times.length >= 3) break;
    if (times.length >= opt.runs && elapsed >= opt.minSeconds) break;
  }
  times.sort((x, y) => x - y);

  const hwm = vmHwmMb();
  if (hwm !== null) rssPeak = Math.max(rssPeak, hwm);
  await session.release();

  return {
    engine: 'onnxruntime',
    model,
    class: formatClass(pairs),
    threads: opt.threads,
    median_ms: round(median(times)),
    p90_ms: round(percentile(times, 90)),
    min_ms: round(times[0]),
    runs: times.length,
    peak_rss_mb: round(rssPeak, 1),
    rss_delta_mb: round(rssPeak - rssBase, 1),
    max_abs_err: maxAbsErr === null ? null : Number(maxAbsErr.toExponential(3)),
    inputs: isRef ? 'reference' : 'generated',
    version: `onnxruntime-node ${ort.env.versions && ort.env.versions.node}`,
  };
}

function usage(msg) {
  if (msg) process.stderr.write(`ort_bench: ${msg}\n`);
  process.stderr.write('usage: node ort_bench.js [--threads T] [--warmup N] [--runs N] ' +
      '[--min-seconds S] [--max-seconds S] [--max-runs N] [--class SPEC] MODEL_DIR[@CLASS] ...\n');
  process.exit(2);
}

async function main() {
  const opt = { threads: 1, warmup: 5, runs: 30, minSeconds: 1, maxSeconds: 5, maxRuns: 100000 };
  const jobs = [];
  let cls = null;
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => { if (i + 1 >= argv.length) usage(`${a} needs a value`); return argv[++i]; };
    if (a === '--threads') opt.threads = Number(val());
    else if (a === '--warmup') opt.warmup = Number(val());
    else if (a === '--runs') opt.runs = Number(val());
    else if (a === '--min-seconds') opt.minSeconds = Number(val());
    else if (a === '--max-seconds') opt.maxSeconds = Number(val());
    else if (a === '--max-runs') opt.maxRuns = Number(val());
    else if (a === '--class') cls = val();
    else if (a === '-h' || a === '--help') usage();
    else if (a.startsWith('--')) usage(`unknown option ${a}`);
    else {
      const at = a.indexOf('@');
      jobs.push(at >= 0 ? [a.slice(0, at), a.slice(at + 1)] : [a, cls]);
    }
  }
  if (!jobs.length) usage('no model directory given');
  if (!(opt.threads >= 1)) usage('--threads must be >= 1');
  let failed = 0;
  for (const [dir, spec] of jobs) {
    try {
      const r = await benchOne(dir, spec, opt);
      process.stdout.write(JSON.stringify(r) + '\n');
    } catch (e) {
      failed++;
      process.stderr.write(`ort_bench: ${dir}${spec ? ' ' + spec : ''}: ${e.stack || e}\n`);
    }
  }
  process.exitCode = failed ? 1 : 0;
}

module.exports = { readNpy, parseClass, formatClass, genInput, fnv1a, mulberry32 };

if (require.main === module) {
  main();
}
