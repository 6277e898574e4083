// Check this client's codec against every vector in schemas/vectors/*.json, as schemas/README.md
// ("Test vectors") says: positive vectors decode to `canonical_json` (or `json`) and re-encode to
// `canonical_msgpack_hex` (or `msgpack_hex`) byte for byte; error envelopes also map to the typed
// error; negative vectors fail to decode with `error_code`.
// Usage: node check_vectors.mjs  -> one line per failure, then "N passed, N failed"; exit 1 on any.
import { readFileSync, readdirSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";
import { SCHEMAS, decode, encode, jsonView, unpack } from "./codec.mjs";
import { errorFromEnvelope } from "./errors.mjs";

/** The vectors' JSON; an integer beyond 2^53 cannot be compared exactly after JSON.parse: say so. */
function parseJson(text) {
  return JSON.parse(text, (key, value) => {
    if (Number.isInteger(value) && !Number.isSafeInteger(value)) {
      throw new Error(`${key}: ${value} is beyond 2^53; JSON.parse cannot hold it exactly`);
    }
    return value;
  });
}

function checkPositive(vector) {
  const bytes = Buffer.from(vector.msgpack_hex, "hex");
  const unpacked = jsonView(unpack(bytes)); // the plain msgpack layer first: `json` is what the bytes unpack to
  if (!isDeepStrictEqual(unpacked, vector.json)) return `unpacked ${JSON.stringify(unpacked, bigints)} != json`;
  const message = decode(vector.type, bytes);
  const expected = vector.canonical_json ?? vector.json;
  if (!isDeepStrictEqual(jsonView(message), expected)) {
    return `decoded ${JSON.stringify(jsonView(message), bigints)} != ${JSON.stringify(expected, bigints)}`;
  }
  const again = Buffer.from(encode(vector.type, message)).toString("hex");
  const want = vector.canonical_msgpack_hex ?? vector.msgpack_hex;
  if (again !== want) return `re-encoded ${again} != ${want}`;
  if (vector.role === "error") {
    const err = errorFromEnvelope(message.error);
    const want = vector.family_fallback ?? message.error.code;
    if (err.code !== message.error.code || err.known !== want) return `typed error ${err.known} != ${want}`;
    const { retryable, details } = message.error;
    if (err.retryable !== retryable || err.message !== message.error.message || err.details !== details) return "typed error fields";
  }
  return null;
}

function checkNegative(vector) {
  try {
    decode(vector.type, Buffer.from(vector.msgpack_hex, "hex"));
  } catch (exc) {
    if (exc.code === vector.error_code) return null;
    return `failed with ${exc.code ?? exc} (${exc.message}), expected ${vector.error_code}`;
  }
  return `decoded, expected ${vector.error_code}`;
}

const bigints = (_k, v) => (typeof v === "bigint" ? v.toString() : v);

let passed = 0;
let failed = 0;
const dir = new URL("vectors/", SCHEMAS);
for (const file of readdirSync(dir).filter((f) => f.endsWith(".json")).sort()) {
  for (const vector of parseJson(readFileSync(new URL(file, dir), "utf8")).vectors) {
    let problem;
    try {
      problem = "error_code" in vector ? checkNegative(vector) : checkPositive(vector);
    } catch (exc) {
      problem = `threw ${exc.code ?? ""} ${exc.message}`;
    }
    if (problem) {
      failed += 1;
      console.log(`FAIL ${file} ${vector.name}: ${problem}`);
    } else passed += 1;
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
