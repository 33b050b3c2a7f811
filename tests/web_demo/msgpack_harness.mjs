// Test harness: runs web_demo/msgpack.js under node for tests/web_demo/test_msgpack.py.
// argv[2]: path of a copy of msgpack.js (with an .mjs name so that node loads it as an ES module).
// stdin: JSON {"packed": [hex, ...], "values": [tagged, ...]}; stdout: JSON with the results.
// "Tagged" JSON carries what JSON cannot: {"$bin": hex}, {"$int": "decimal"},
// {"$float": "repr"}, {"$map": [[key, value], ...]} (keeps key order and key types).
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const { encode, decode } = await import(pathToFileURL(process.argv[2]).href);

const toHex = (b) => Buffer.from(b).toString("hex");
const fromHex = (h) => new Uint8Array(Buffer.from(h, "hex"));

function fromTagged(t) {
  if (t === null || typeof t !== "object") return t;
  if (Array.isArray(t)) return t.map(fromTagged);
  if ("$bin" in t) return fromHex(t.$bin);
  if ("$int" in t) return BigInt(t.$int);
  if ("$float" in t) {
    const s = t.$float;
    return s === "nan" ? NaN : s === "inf" ? Infinity : s === "-inf" ? -Infinity : parseFloat(s);
  }
  if ("$map" in t) return new Map(t.$map.map(([k, v]) => [fromTagged(k), fromTagged(v)]));
  throw new Error("bad tag " + JSON.stringify(t));
}

function toTagged(v) {
  if (v === null || typeof v === "boolean" || typeof v === "string") return v;
  if (typeof v === "bigint") return { $int: v.toString() };
  if (typeof v === "number") {
    if (Number.isSafeInteger(v) && !Object.is(v, -0)) return v;
    if (Number.isNaN(v)) return { $float: "nan" };
    if (!Number.isFinite(v)) return { $float: v > 0 ? "inf" : "-inf" };
    return { $float: Object.is(v, -0) ? "-0.0" : String(v) };
  }
  if (v instanceof Uint8Array) return { $bin: toHex(v) };
  if (Array.isArray(v)) return v.map(toTagged);
  const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
  return { $map: entries.map(([k, x]) => [toTagged(k), toTagged(x)]) };
}

function attempt(fn) {
  try { return fn(); } catch (e) { return { error: String(e && e.message || e) }; }
}

const input = JSON.parse(readFileSync(0, "utf8"));
const out = {
  // Python bytes -> JS value -> bytes, maps decoded as Map and as plain objects.
  reencodedMap: input.packed.map((h) => attempt(() => toHex(encode(decode(fromHex(h), { useMap: true }))))),
  reencodedObject: input.packed.map((h) => attempt(() => toHex(encode(decode(fromHex(h)))))),
  // Python bytes -> JS value, sent back as tagged JSON for a value comparison in Python.
  decoded: input.packed.map((h) => attempt(() => toTagged(decode(fromHex(h), { useMap: true })))),
  // A value built in JS -> JS bytes, to compare with Python's bytes for the same value.
  encoded: input.values.map((t) => attempt(() => toHex(encode(fromTagged(t))))),
  // Malformed input must throw, not return garbage.
  malformed: (input.malformed || []).map((h) => attempt(() => { decode(fromHex(h)); return "no error"; })),
};
process.stdout.write(JSON.stringify(out));
