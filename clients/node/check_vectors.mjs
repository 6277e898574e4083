// Check this client's codec against every vector in schemas/vectors/*.json, as schemas/README.md
// ("Test vectors") says: positive vectors decode to `canonical_json` (or `json`) and re-encode to
// `canonical_msgpack_hex` (or `msgpack_hex`) byte for byte; error envelopes also map to the typed
// error; negative vectors fail to decode with `error_code`.
// Usage: node check_vectors.mjs  -> one line per failure, then "N passed, N failed"; exit 1 on any.
import { readFileSync, readdirSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";
import { SCHEMAS, decode, encode, jsonView, unpack } from "./codec.mjs";
import { errorFromEnvelope } from "./errors.mjs";

/** The vectors' JSON with integers beyond 2^53 kept exact (as BigInt), like the decoder does. */
function parseJson(text) {
  return JSON.parse(text, (_key, value, ctx) =>
    typeof value === "number" && !Number.isSafeInteger(value) && Number.isInteger(value) && ctx?.source
      ? BigInt(ctx.source)
      : value,
  );
}

function checkPositive(vector) {
  const bytes = Buffer.from(vector.msgpack_hex, "hex");
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
    if (err.retryable !== message.error.retryable || err.message !== message.error.message) return "typed error fields";
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
void unpack;
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
