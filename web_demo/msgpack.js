// A small msgpack encoder/decoder (the subset voxgate's protocol uses, and a little more).
//
// Types: nil, bool, ints (up to 64 bits), float32/64, str, bin, array, map.
// Not supported: ext types (including timestamps); the decoder throws on them.
//
// Mapping to JavaScript:
//   nil            <-> null (undefined also encodes as nil)
//   int            <-> Number when it is a safe integer, otherwise BigInt
//   float32/64      -> Number;  Number that is not an integer (or is -0, NaN, ±Infinity) -> float64
//   str            <-> string (UTF-8)
//   bin            <-> Uint8Array (any ArrayBuffer view or ArrayBuffer encodes as bin)
//   array          <-> Array
//   map            <-> plain object (or a Map with {useMap: true}); a Map encodes in its own order
//
// Encoding picks the smallest representation, as the Python msgpack package does, so that
// re-encoding a decoded message gives back the same bytes (tests/web_demo/test_msgpack.py).
// One inherent exception: JavaScript has a single number type, so a float that holds an
// integral value (2.0) decodes to 2 and re-encodes as an int.

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

const UINT32 = 0x1_0000_0000;
const MIN_INT64 = -(2n ** 63n);
const MAX_UINT64 = 2n ** 64n - 1n;

class Writer {
  constructor() {
    this.buf = new Uint8Array(256);
    this.view = new DataView(this.buf.buffer);
    this.pos = 0;
  }

  reserve(n) {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  u8(v) { this.reserve(1); this.buf[this.pos++] = v; }
  u16(v) { this.reserve(2); this.view.setUint16(this.pos, v); this.pos += 2; }
  u32(v) { this.reserve(4); this.view.setUint32(this.pos, v); this.pos += 4; }
  u64(v) { this.reserve(8); this.view.setBigUint64(this.pos, v); this.pos += 8; }
  i64(v) { this.reserve(8); this.view.setBigInt64(this.pos, v); this.pos += 8; }
  f64(v) { this.reserve(8); this.view.setFloat64(this.pos, v); this.pos += 8; }
  bytes(b) { this.reserve(b.length); this.buf.set(b, this.pos); this.pos += b.length; }

  result() { return this.buf.slice(0, this.pos); }
}

function writeInt(w, v) {
  // v: a safe-integer Number or a BigInt already known to fit in 64 bits.
  if (typeof v === "bigint") {
    if (v >= -(2n ** 31n) && v < 2n ** 32n) return writeInt(w, Number(v));
    if (v >= 0n) { w.u8(0xcf); w.u64(v); } else { w.u8(0xd3); w.i64(v); }
    return;
  }
  if (v >= 0) {
    if (v < 0x80) w.u8(v);
    else if (v < 0x100) { w.u8(0xcc); w.u8(v); }
    else if (v < 0x10000) { w.u8(0xcd); w.u16(v); }
    else if (v < UINT32) { w.u8(0xce); w.u32(v); }
    else { w.u8(0xcf); w.u64(BigInt(v)); }
  } else {
    if (v >= -32) w.u8(v & 0xff);
    else if (v >= -0x80) { w.u8(0xd0); w.u8(v & 0xff); }
    else if (v >= -0x8000) { w.u8(0xd1); w.u16(v & 0xffff); }
    else if (v >= -0x8000_0000) { w.u8(0xd2); w.u32(v >>> 0); }
    else { w.u8(0xd3); w.i64(BigInt(v)); }
  }
}

function writeLength(w, n, fix, fixMax, c8, c16, c32) {
  if (fix !== null && n <= fixMax) w.u8(fix | n);
  else if (c8 !== null && n < 0x100) { w.u8(c8); w.u8(n); }
  else if (n < 0x10000) { w.u8(c16); w.u16(n); }
  else if (n < UINT32) { w.u8(c32); w.u32(n); }
  else throw new RangeError("msgpack: object too large");
}

function writeValue(w, v, depth) {
  if (depth > 512) throw new RangeError("msgpack: nesting too deep");
  if (v === null || v === undefined) return w.u8(0xc0);
  switch (typeof v) {
    case "boolean":
      return w.u8(v ? 0xc3 : 0xc2);
    case "number":
      if (Number.isSafeInteger(v) && !Object.is(v, -0)) return writeInt(w, v);
      w.u8(0xcb);
      return w.f64(v);
    case "bigint":
      if (v < MIN_INT64 || v > MAX_UINT64) throw new RangeError("msgpack: integer out of 64-bit range");
      return writeInt(w, v);
    case "string": {
      const b = utf8Encoder.encode(v);
      writeLength(w, b.length, 0xa0, 31, 0xd9, 0xda, 0xdb);
      return w.bytes(b);
    }
    case "object":
      break;
    default:
      throw new TypeError(`msgpack: cannot encode a ${typeof v}`);
  }
  if (v instanceof Uint8Array || ArrayBuffer.isView(v) || v instanceof ArrayBuffer) {
    const b = v instanceof Uint8Array ? v
      : v instanceof ArrayBuffer ? new Uint8Array(v)
        : new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
    writeLength(w, b.length, null, 0, 0xc4, 0xc5, 0xc6);
    return w.bytes(b);
  }
  if (Array.isArray(v)) {
    writeLength(w, v.length, 0x90, 15, null, 0xdc, 0xdd);
    for (const item of v) writeValue(w, item, depth + 1);
    return;
  }
  const entries = v instanceof Map ? [...v.entries()] : Object.entries(v);
  writeLength(w, entries.length, 0x80, 15, null, 0xde, 0xdf);
  for (const [key, value] of entries) {
    writeValue(w, key, depth + 1);
    writeValue(w, value, depth + 1);
  }
}

/** Encode a value as msgpack. Returns a Uint8Array of exactly the encoded length. */
export function encode(value) {
  const w = new Writer();
  writeValue(w, value, 0);
  return w.result();
}

class Reader {
  constructor(bytes, options) {
    this.bytes = bytes;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
    this.useMap = Boolean(options.useMap);
  }

  need(n) {
    if (this.pos + n > this.bytes.length) throw new RangeError("msgpack: truncated input");
  }

  u8() { this.need(1); return this.bytes[this.pos++]; }
  u16() { this.need(2); const v = this.view.getUint16(this.pos); this.pos += 2; return v; }
  u32() { this.need(4); const v = this.view.getUint32(this.pos); this.pos += 4; return v; }
  i8() { this.need(1); const v = this.view.getInt8(this.pos); this.pos += 1; return v; }
  i16() { this.need(2); const v = this.view.getInt16(this.pos); this.pos += 2; return v; }
  i32() { this.need(4); const v = this.view.getInt32(this.pos); this.pos += 4; return v; }
  u64() { this.need(8); const v = this.view.getBigUint64(this.pos); this.pos += 8; return narrow(v); }
  i64() { this.need(8); const v = this.view.getBigInt64(this.pos); this.pos += 8; return narrow(v); }
  f32() { this.need(4); const v = this.view.getFloat32(this.pos); this.pos += 4; return v; }
  f64() { this.need(8); const v = this.view.getFloat64(this.pos); this.pos += 8; return v; }

  take(n) {
    this.need(n);
    const out = this.bytes.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  str(n) { return utf8Decoder.decode(this.take(n)); }
  // slice() copies: the caller gets its own buffer, aligned at offset 0 (handy for typed views).
  bin(n) { return this.take(n).slice(); }

  array(n, depth) {
    const out = new Array(n);
    for (let i = 0; i < n; i++) out[i] = this.value(depth + 1);
    return out;
  }

  map(n, depth) {
    if (this.useMap) {
      const out = new Map();
      for (let i = 0; i < n; i++) { const k = this.value(depth + 1); out.set(k, this.value(depth + 1)); }
      return out;
    }
    const out = {};
    for (let i = 0; i < n; i++) {
      const k = this.value(depth + 1);
      const v = this.value(depth + 1);
      // defineProperty so that a "__proto__" key is stored as data, never as a prototype.
      Object.defineProperty(out, String(k), { value: v, enumerable: true, writable: true, configurable: true });
    }
    return out;
  }

  value(depth) {
    if (depth > 512) throw new RangeError("msgpack: nesting too deep");
    const c = this.u8();
    if (c < 0x80) return c;
    if (c < 0x90) return this.map(c & 0x0f, depth);
    if (c < 0xa0) return this.array(c & 0x0f, depth);
    if (c < 0xc0) return this.str(c & 0x1f);
    if (c >= 0xe0) return c - 0x100;
    switch (c) {
      case 0xc0: return null;
      case 0xc2: return false;
      case 0xc3: return true;
      case 0xc4: return this.bin(this.u8());
      case 0xc5: return this.bin(this.u16());
      case 0xc6: return this.bin(this.u32());
      case 0xca: return this.f32();
      case 0xcb: return this.f64();
      case 0xcc: return this.u8();
      case 0xcd: return this.u16();
      case 0xce: return this.u32();
      case 0xcf: return this.u64();
      case 0xd0: return this.i8();
      case 0xd1: return this.i16();
      case 0xd2: return this.i32();
      case 0xd3: return this.i64();
      case 0xd9: return this.str(this.u8());
      case 0xda: return this.str(this.u16());
      case 0xdb: return this.str(this.u32());
      case 0xdc: return this.array(this.u16(), depth);
      case 0xdd: return this.array(this.u32(), depth);
      case 0xde: return this.map(this.u16(), depth);
      case 0xdf: return this.map(this.u32(), depth);
      default:
        throw new TypeError(`msgpack: unsupported type byte 0x${c.toString(16)} (ext types are not supported)`);
    }
  }
}

function narrow(big) {
  const n = Number(big);
  return Number.isSafeInteger(n) ? n : big;
}

/**
 * Decode one msgpack value from a Uint8Array, ArrayBuffer or other ArrayBuffer view.
 * Throws if the input is truncated, malformed, or has bytes left over.
 * options.useMap: decode maps as Map (keeps any key type and order) instead of plain objects.
 */
export function decode(input, options = {}) {
  const bytes = input instanceof Uint8Array ? input
    : input instanceof ArrayBuffer ? new Uint8Array(input)
      : new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
  const r = new Reader(bytes, options);
  const value = r.value(0);
  if (r.pos !== bytes.length) throw new RangeError(`msgpack: ${bytes.length - r.pos} bytes left over`);
  return value;
}
