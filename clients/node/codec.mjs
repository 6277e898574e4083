// The Sandpod wire codec, driven by schemas/messages/*.schema.json at run time.
//
// Why schema-driven: this client exists to prove schemas/ is enough, so it has no hand-written
// message classes. Bytes flow: msgpack -> WireDecoder (floats stay distinguishable from ints,
// int64 stays exact) -> readMessage (types, defaults, value rules from the schema) -> a plain
// object. Back: toWire (field order, defaults, nil omitted, numbers as float64) -> WireEncoder.
import { Decoder, Encoder } from "@msgpack/msgpack";
import { readFileSync } from "node:fs";

export const SCHEMAS = new URL("../../schemas/", import.meta.url);

/** A wire error of the codec: `code` is an errors.json code (bad_request...). */
export class CodecError extends Error {
  constructor(code, message, details = {}) {
    super(message);
    this.code = code;
    this.details = details;
  }
}

/** A msgpack float, kept boxed so 1.0 on the wire is not confused with the integer 1. */
export class Float64 {
  constructor(value) {
    this.value = value;
  }
}

const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true });

class WireDecoder extends Decoder {
  readF64() {
    return new Float64(super.readF64());
  }
  readF32() {
    return new Float64(super.readF32());
  }
  // README "Decoders": a str must be valid UTF-8 (the library would put U+FFFD in its place).
  decodeUtf8String(byteLength, headerOffset) {
    const start = this.pos + headerOffset;
    if (this.bytes.byteLength >= start + byteLength) {
      try {
        STRICT_UTF8.decode(this.bytes.subarray(start, start + byteLength));
      } catch {
        throw new CodecError("bad_request", "a msgpack str is not valid UTF-8");
      }
    }
    return super.decodeUtf8String(byteLength, headerOffset);
  }
  // README "Decoders": ext values (the timestamp -1 too) are never sent and refused anywhere.
  decodeExtension() {
    throw new CodecError("bad_request", "payload holds a msgpack ext value");
  }
}

class WireEncoder extends Encoder {
  doEncode(object, depth) {
    if (object instanceof Float64) this.encodeNumberAsFloat(object.value);
    else if (typeof object === "bigint") this.encodeBigInt64(object);
    else super.doEncode(object, depth);
  }
}

const decoder = new WireDecoder({
  useBigInt64: true, // uint64/int64 headers as BigInt: exact; narrowed to Number when safe
  mapKeyConverter: (key) => {
    if (typeof key !== "string") throw new CodecError("bad_request", "map keys must be str");
    return key;
  },
});
const encoder = new WireEncoder();

const schemaCache = new Map();
/** The JSON Schema of a message TYPE (schemas/messages/<type>.schema.json). */
export function schemaOf(type) {
  if (!schemaCache.has(type)) {
    const url = new URL(`messages/${type}.schema.json`, SCHEMAS);
    schemaCache.set(type, JSON.parse(readFileSync(url, "utf8")));
  }
  return schemaCache.get(type);
}

export const isMap = (x) =>
  typeof x === "object" && x !== null && !Array.isArray(x) && !ArrayBuffer.isView(x) && !(x instanceof Float64);

function fail(path, why) {
  throw new CodecError("bad_request", `${path}: ${why}`, { field: path });
}

const narrow = (n) => (typeof n === "bigint" && Number.isSafeInteger(Number(n)) ? Number(n) : n);
const codePoints = (s) => [...s].length;

/** A schema `default` (JSON view) as a wire value. */
function fromJsonDefault(prop, value) {
  if (isMap(value) && "$bytes" in value) return new Uint8Array(Buffer.from(value.$bytes, "base64"));
  if (prop.type === "number") return new Float64(value);
  return structuredClone(value);
}

/** Decode one wire value against a property schema (types first, then value rules). */
function readValue(prop, raw, path) {
  if (prop.$ref) return readMessage(schemaOf(prop.$ref.replace(".schema.json", "")), raw, path);
  let value = raw;
  switch (prop.type) {
    case "integer":
      if (typeof raw === "bigint") value = narrow(raw);
      else if (typeof raw !== "number") fail(path, "expected an integer");
      break;
    case "number":
      if (raw instanceof Float64) break;
      if (typeof raw === "number" || typeof raw === "bigint") value = new Float64(Number(raw));
      else fail(path, "expected a number");
      break;
    case "string":
      if (prop["x-msgpack"] === "bin") {
        if (!(raw instanceof Uint8Array)) fail(path, "expected bin");
      } else if (typeof raw !== "string") fail(path, "expected str");
      break;
    case "boolean":
      if (typeof raw !== "boolean") fail(path, "expected a bool");
      break;
    case "array":
      if (!Array.isArray(raw)) fail(path, "expected an array");
      value = raw.map((item, i) => readValue(prop.prefixItems?.[i] ?? prop.items ?? {}, item, `${path}[${i}]`));
      break;
    case "object":
      if (!isMap(raw)) fail(path, "expected a map");
      if (prop.properties) value = readMessage(prop, raw, path);
      else if (isMap(prop.additionalProperties)) {
        value = {};
        for (const [k, item] of Object.entries(raw)) {
          checkRules(prop.propertyNames ?? {}, k, `${path}.${k}`);
          value[k] = readValue(prop.additionalProperties, item, `${path}.${k}`);
        }
      }
      break;
    default:
      break; // untyped: any value
  }
  checkRules(prop, value, path);
  return value;
}

/** JSON Schema value rules (the subset schemas/ uses). */
function checkRules(prop, value, path) {
  const n = value instanceof Float64 ? value.value : value;
  if (prop.enum && !prop.enum.includes(n)) fail(path, `not one of ${prop.enum}`);
  if ("const" in prop && n !== prop.const) fail(path, `must be ${prop.const}`);
  if (typeof n === "number" || typeof n === "bigint") {
    if ("minimum" in prop && n < prop.minimum) fail(path, `below ${prop.minimum}`);
    if ("maximum" in prop && n > prop.maximum) fail(path, `above ${prop.maximum}`);
    if ("exclusiveMinimum" in prop && n <= prop.exclusiveMinimum) fail(path, `not above ${prop.exclusiveMinimum}`);
    if ("exclusiveMaximum" in prop && n >= prop.exclusiveMaximum) fail(path, `not below ${prop.exclusiveMaximum}`);
  }
  if (typeof n === "string") {
    if ("minLength" in prop && codePoints(n) < prop.minLength) fail(path, "too short");
    if ("maxLength" in prop && codePoints(n) > prop.maxLength) fail(path, "too long");
    if (prop.pattern && !new RegExp(prop.pattern, "u").test(n)) fail(path, `does not match ${prop.pattern}`);
  }
  if (Array.isArray(n)) {
    if ("minItems" in prop && n.length < prop.minItems) fail(path, "too few items");
    if ("maxItems" in prop && n.length > prop.maxItems) fail(path, "too many items");
  }
  if (isMap(n)) {
    const count = Object.keys(n).length;
    if ("minProperties" in prop && count < prop.minProperties) fail(path, "too few entries");
    if ("maxProperties" in prop && count > prop.maxProperties) fail(path, "too many entries");
  }
}

/** Decode a map as a message (or an inline object schema): fields in field order, defaults applied. */
function readMessage(schema, raw, path) {
  if (!isMap(raw)) fail(path, "expected a map");
  const version = schema["x-sandpod-version"];
  if (version !== undefined) {
    const v = narrow(raw.v);
    if (typeof v !== "number" || !Number.isInteger(v)) fail(`${path}.v`, "missing or not an integer");
    if (v > version) throw new CodecError("bad_request.unsupported_version", `${path}: v=${v} > ${version}`);
  }
  const out = {};
  for (const name of schema["x-sandpod-field-order"]) {
    const prop = schema.properties[name];
    const raw_ = raw[name];
    if (raw_ === null || raw_ === undefined) {
      if (schema.required?.includes(name)) fail(`${path}.${name}`, "required");
      if ("default" in prop) out[name] = fromJsonDefault(prop, prop.default);
      continue;
    }
    out[name] = readValue(prop, raw_, `${path}.${name}`);
  }
  if (!presenceHolds(schema, raw)) fail(path, `field combination not allowed: ${JSON.stringify(combinators(schema))}`);
  return out;
}

const combinators = ({ oneOf, anyOf, allOf, not }) => ({ oneOf, anyOf, allOf, not });

/** Message-level rules on which fields are present (required / oneOf / anyOf / allOf / not). */
function presenceHolds(schema, raw) {
  const holds = (sub) => presenceHolds(sub, raw);
  if (!(schema.required ?? []).every((k) => raw[k] !== null && raw[k] !== undefined)) return false;
  if (schema.oneOf && schema.oneOf.filter(holds).length !== 1) return false;
  if (schema.anyOf && !schema.anyOf.some(holds)) return false;
  if (schema.allOf && !schema.allOf.every(holds)) return false;
  return !(schema.not && holds(schema.not));
}

/** Raw msgpack -> JS values (bad bytes, trailing bytes, non-str keys: bad_request). */
export function unpack(bytes) {
  try {
    return decoder.decode(bytes);
  } catch (exc) {
    if (exc instanceof CodecError) throw exc;
    throw new CodecError("bad_request", `not one msgpack value: ${exc.message}`);
  }
}

/** Decode `bytes` as message `type`; throws CodecError with the wire code. */
export function decode(type, bytes) {
  return readMessage(schemaOf(type), unpack(bytes), type);
}

/** A message (plain object) as its canonical wire value: v, field order, defaults, no nils. */
export function toWire(schema, message) {
  const out = {};
  for (const name of schema["x-sandpod-field-order"]) {
    const prop = schema.properties[name];
    let value = name === "v" ? message.v ?? schema["x-sandpod-version"] : message[name];
    if (value === null || value === undefined) {
      if (!("default" in prop)) continue;
      value = fromJsonDefault(prop, prop.default);
    }
    out[name] = wireValue(prop, value);
  }
  return out;
}

function wireValue(prop, value) {
  if (prop.$ref) return toWire(schemaOf(prop.$ref.replace(".schema.json", "")), value);
  if (prop.type === "number") return value instanceof Float64 ? value : new Float64(Number(value));
  if (prop["x-msgpack"] === "bin" && typeof value === "string") return new TextEncoder().encode(value);
  if (prop.type === "array") return value.map((item, i) => wireValue(prop.prefixItems?.[i] ?? prop.items ?? {}, item));
  if (prop.type === "object" && prop.properties) return toWire(prop, value);
  return value;
}

/** Encode message `type` canonically. */
export function encode(type, message) {
  return encoder.encode(toWire(schemaOf(type), message));
}

/** The vectors' JSON view of a decoded value: bytes as {$bytes}, floats as numbers. */
export function jsonView(value) {
  if (value instanceof Float64) return value.value;
  if (value instanceof Uint8Array) return { $bytes: Buffer.from(value).toString("base64") };
  if (typeof value === "bigint") return narrow(value);
  if (Array.isArray(value)) return value.map(jsonView);
  if (isMap(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, jsonView(v)]));
  return value;
}
