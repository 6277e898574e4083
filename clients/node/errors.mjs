// Typed errors built from schemas/errors.json: one Error subclass per code, subclassing its
// `parent`, so `err instanceof errorClass("exec.spawn_failed")` holds for exec.invalid_cwd.
// Callers branch on `code` / `retryable` / instanceof, never on the message.
import { readFileSync } from "node:fs";
import { SCHEMAS } from "./codec.mjs";

const CATALOGUE = JSON.parse(readFileSync(new URL("errors.json", SCHEMAS), "utf8"));
const CODES = new Map(CATALOGUE.codes.map((entry) => [entry.code, entry]));

/** The root of every Sandpod error: `code` as on the wire, `known` the catalogued code it maps to. */
export class SandpodError extends Error {
  constructor(code, message, { retryable, details = {}, known = code } = {}) {
    super(message);
    this.code = code;
    this.known = known;
    this.retryable = retryable ?? CODES.get(known)?.retryable ?? false;
    this.details = details;
  }
}
Object.defineProperty(SandpodError.prototype, "name", { value: "SandpodError" });

const classes = new Map();
/** The Error subclass of a catalogued code (SandpodError for unknown ones). */
export function errorClass(code) {
  const entry = CODES.get(code);
  if (!entry) return SandpodError;
  if (!classes.has(code)) {
    const Parent = entry.parent ? errorClass(entry.parent) : SandpodError;
    const cls = class extends Parent {};
    Object.defineProperty(cls, "name", { value: `SandpodError(${code})` });
    Object.defineProperty(cls.prototype, "name", { value: `SandpodError(${code})` });
    classes.set(code, cls);
  }
  return classes.get(code);
}

/** The catalogued code an unknown code falls back to (errors.json `unknown_codes`). */
export function knownCode(code) {
  if (CODES.has(code)) return code;
  const parts = code.split(".");
  for (let end = parts.length - 1; end > 0; end -= 1) {
    const prefix = parts.slice(0, end).join(".");
    if (CODES.has(prefix)) return prefix; // the longest known dot-prefix
  }
  if (CODES.has(`${parts[0]}.error`)) return `${parts[0]}.error`;
  return "internal"; // the generic error
}

/** A typed error for a code raised here or received (keeps an unknown code as it came). */
export function makeError(code, message, { retryable, details } = {}) {
  const known = knownCode(code);
  const Cls = known ? errorClass(known) : SandpodError;
  return new Cls(code, message, { retryable, details, known: known ?? code });
}

/** The typed error of a decoded envelope's `error` map (the wire's retryable wins). */
export function errorFromEnvelope(error) {
  return makeError(error.code, error.message, { retryable: error.retryable, details: error.details });
}
