// A small Sandpod client for Node.js, written from schemas/ alone (README.md, subjects.json,
// errors.json, messages/, docs/): one-shot exec, streaming exec with flow control, small file
// read/write, typed errors. Every request is msgpack from codec.mjs over the official nats.js.
//
// Flow: Sandbox.request() encodes a request, sends it to <prefix>.sbx.<sandbox>.<family>.<verb>,
// and decodes the reply, or raises the typed error of an error envelope or of a NATS failure.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { connect as natsConnect, createInbox, ErrorCode } from "nats";
import { CodecError, SCHEMAS, decode, encode, isMap, unpack } from "./codec.mjs";
import { errorFromEnvelope, makeError } from "./errors.mjs";

export { SandpodError, errorClass } from "./errors.mjs";

const SUBJECTS = JSON.parse(readFileSync(new URL("subjects.json", SCHEMAS), "utf8"));
const SANDBOX_ID = new RegExp(`^(?:${SUBJECTS.sandbox_id_pattern})$`);
const TOKEN = new RegExp(`^(?:${SUBJECTS.token_pattern})$`);
const FRAME_TYPES = new Map(SUBJECTS.frames.types.map((t) => [t.kind, t.type]));
const OPERATIONS = new Map(SUBJECTS.operations.map((op) => [`${op.family}.${op.verb}`, op]));
const REPLY_SLACK = 10; // seconds added to a command's timeout for the reply deadline (README)
const DEFAULT_DEADLINE = 60; // seconds, for requests that do not run a command
const STALL_MS = 3000; // no frame for this long: ask execd to re-send from the next expected one
const NO_DEADLINE = 24 * 3600; // seconds: a command without timeout; liveness probing ends a dead wait
const PROBE_EVERY = 1; // seconds between liveness probes (README "Liveness probing")
const FETCH_MAX_BYTES = 512 * 1024;

const newExecId = () => randomBytes(16).toString("hex");
const bytesOf = (x) => (x === undefined || x === null ? undefined : typeof x === "string" ? Buffer.from(x) : x);

/** A NATS failure as the contract's client-side code (README "Replies and errors"). */
function natsError(exc, subject) {
  if (exc?.code === ErrorCode.NoResponders) {
    return makeError("sandbox.not_found", `no execd answers on ${subject}`, { details: { subject } });
  }
  if (exc?.code === ErrorCode.Timeout) return makeError("timeout", `no reply on ${subject} in time`);
  if (exc?.code === ErrorCode.ConnectionClosed || exc?.code === ErrorCode.Disconnect) {
    return makeError("connection.lost", `NATS connection lost: ${exc.message}`);
  }
  return exc;
}

/** Decode a reply: the `type` message, or throw the typed error its envelope carries. */
export function decodeReply(type, bytes) {
  try {
    const raw = unpack(bytes);
    if (isMap(raw) && "error" in raw) throw errorFromEnvelope(decode("error", bytes).error);
    return decode(type, bytes);
  } catch (exc) {
    if (exc instanceof CodecError) throw makeError(exc.code, exc.message, { details: exc.details });
    throw exc;
  }
}

/** One sandbox reached over one NATS connection. */
export class Sandbox {
  /** Connect to NATS (`servers`: URL) and address sandbox `id` under `prefix`. */
  static async connect(id, { servers = "nats://127.0.0.1:4222", prefix = SUBJECTS.default_prefix } = {}) {
    if (!SANDBOX_ID.test(id)) throw makeError("bad_request", `invalid sandbox id ${JSON.stringify(id)}`);
    if (!prefix.split(".").every((t) => TOKEN.test(t))) throw makeError("bad_request", `invalid prefix ${prefix}`);
    let nc;
    try {
      nc = await natsConnect({ servers, timeout: 5000 });
    } catch (exc) {
      throw makeError("connection.lost", `cannot connect to NATS at ${servers}: ${exc.message}`);
    }
    return new Sandbox(nc, id, prefix);
  }

  constructor(nc, id, prefix) {
    this.nc = nc;
    this.id = id;
    this.prefix = prefix;
    this.fs = { read: (path, opts) => this.#fsRead(path, opts), write: (path, data, opts) => this.#fsWrite(path, data, opts) };
  }

  /** The data-plane subject of `family.verb` (only operations subjects.json lists). */
  subject(operation) {
    if (!OPERATIONS.has(operation)) throw makeError("bad_request.unknown_subject", `no operation ${operation}`);
    return `${this.prefix}.sbx.${this.id}.${operation}`;
  }

  /** Request `operation` (e.g. "exec.run") with `body`; types come from subjects.json. */
  async request(operation, body, { deadline = DEFAULT_DEADLINE } = {}) {
    const op = OPERATIONS.get(operation);
    const subject = this.subject(operation);
    let msg;
    try {
      msg = await this.nc.request(subject, encode(op.request, body), { timeout: deadline * 1000 });
    } catch (exc) {
      throw natsError(exc, subject);
    }
    return decodeReply(op.reply, msg.data);
  }

  /** Publish without a reply (exec.ack). */
  publish(operation, body) {
    this.nc.publish(this.subject(operation), encode(OPERATIONS.get(operation).request, body));
  }

  /**
   * Run a command to completion (`exec.run`); `command` is argv (array) or a shell line (string).
   * Returns {exitCode, signal, timedOut, stdout: Buffer, stderr: Buffer, duration, execId}.
   * Throws SandpodError subclasses (exec.invalid_cwd, sandbox.not_found, timeout, ...).
   */
  async exec(command, { cwd, env, stdin, timeout, maxOutput } = {}) {
    const body = { exec_id: newExecId(), ...commandFields(command), cwd, env, stdin: bytesOf(stdin), timeout, max_output: maxOutput };
    const deadline = timeout ? timeout + REPLY_SLACK : NO_DEADLINE;
    const r = await this.#probing(this.request("exec.run", body, { deadline }), body.exec_id);
    const out = { stdout: Buffer.from(r.stdout), stderr: Buffer.from(r.stderr) };
    for (const stream of ["stdout", "stderr"]) {
      while (out[stream].length < r[`${stream}_size`]) {
        const part = await this.request("exec.fetch", { exec_id: r.exec_id, stream, offset: out[stream].length, max_bytes: FETCH_MAX_BYTES });
        out[stream] = Buffer.concat([out[stream], part.data]);
        if (part.eof) break;
      }
    }
    return { execId: r.exec_id, exitCode: r.exit_code ?? null, signal: r.signal ?? null, timedOut: r.timed_out, duration: r.duration.value, ...out };
  }

  /**
   * Streaming exec (`exec.start`): `onChunk(stream, Buffer)` gets the output in seq order; resolves
   * with the exit frame as {exitCode, signal, timedOut, cancelled, abandoned, stdoutSize, stderrSize}.
   * Acks each window/4 bytes, keeps the stream alive every abandon_after/4, resumes on gaps.
   */
  async execStream(command, onChunk, { cwd, env, stdin, timeout, window } = {}) {
    const execId = newExecId();
    const deliver = createInbox();
    const sub = this.nc.subscribe(deliver);
    try {
      const started = await this.request("exec.start", { exec_id: execId, deliver, ...commandFields(command), cwd, env, stdin: bytesOf(stdin), timeout, window });
      return await this.#consume(sub, started, onChunk);
    } finally {
      sub.unsubscribe();
    }
  }

  async #consume(sub, started, onChunk) {
    const execId = started.exec_id;
    let expected = 1;
    let unacked = 0;
    let resumedAt = 0;
    const ack = (seq) => this.publish("exec.ack", { exec_id: execId, seq });
    const keepalive = setInterval(() => ack(expected - 1), ((started.abandon_after?.value ?? 60) * 1000) / 4);
    // A lost frame is seen when a later one comes; the last ones (the exit frame too) have
    // nothing after them: when no frame came for STALL_MS, ask execd to re-send from the next.
    let lastFrame = Date.now();
    const watchdog = setInterval(() => {
      if (Date.now() - lastFrame < STALL_MS) return;
      lastFrame = Date.now();
      this.request("exec.resume", { exec_id: execId, from_seq: expected }).catch(() => {});
    }, STALL_MS);
    try {
      for await (const msg of sub) {
        lastFrame = Date.now();
        const raw = unpack(msg.data);
        const type = FRAME_TYPES.get(isMap(raw) ? raw.kind : undefined);
        if (!type) throw makeError("bad_request", `unknown frame kind on ${sub.getSubject()}`);
        const frame = decode(type, msg.data);
        if (frame.seq < expected) continue; // a duplicate (resume re-sent it)
        if (frame.seq > expected) {
          if (resumedAt !== expected) {
            resumedAt = expected; // once per gap: execd re-sends every retained frame >= expected
            await this.request("exec.resume", { exec_id: execId, from_seq: expected });
          }
          continue;
        }
        expected += 1;
        if (frame.kind === "exit") {
          ack(frame.seq); // execd keeps the stream until its exit frame is acked
          return {
            execId, exitCode: frame.exit_code ?? null, signal: frame.signal ?? null, timedOut: frame.timed_out,
            cancelled: frame.cancelled, abandoned: frame.abandoned, stdoutSize: frame.stdout_size, stderrSize: frame.stderr_size,
          };
        }
        await onChunk(frame.stream, Buffer.from(frame.data));
        unacked += frame.data.length;
        if (unacked >= started.window / 4) {
          ack(frame.seq);
          unacked = 0;
        }
      }
      throw makeError("connection.lost", "the frame subscription closed before the exit frame");
    } finally {
      clearInterval(keepalive);
      clearInterval(watchdog);
    }
  }

  /** Await `pending` (an exec.run) while probing exec.status, as the README's table says. */
  async #probing(pending, execId) {
    const stop = new AbortController();
    const probe = async () => {
      let exited = 0;
      let silent = 0;
      for (;;) {
        await sleep(PROBE_EVERY * 1000, undefined, { signal: stop.signal });
        let status;
        try {
          status = await this.request("exec.status", { exec_id: execId }, { deadline: PROBE_EVERY });
        } catch (exc) {
          if (stop.signal.aborted) return;
          if (exc.known === "exec.not_found") throw makeError("exec.lost", `execd no longer knows exec ${execId}`);
          if (exc.code === "sandbox.not_found") throw makeError("sandbox.unavailable", `no execd serves ${this.id} any more`);
          if (exc.code !== "timeout") throw exc;
          if (++silent >= 3) throw makeError("sandbox.unavailable", `execd of ${this.id} stopped answering`);
          continue;
        }
        silent = 0;
        if (status.state === "exited" && ++exited >= 2 && !stop.signal.aborted) {
          throw makeError("exec.lost", `exec ${execId} exited but its reply was lost`);
        }
      }
    };
    const prober = probe().catch((exc) => {
      if (exc.name !== "AbortError") throw exc;
    });
    try {
      return await Promise.race([pending, prober.then(() => pending)]);
    } finally {
      stop.abort();
      pending.catch(() => {}); // a failed probe settled the call: the late reply (or its error) is moot
    }
  }

  async #fsWrite(path, data, { mode, makeParents, exclusive } = {}) {
    return this.request("fs.write", { path, data: bytesOf(data), mode, make_parents: makeParents, exclusive });
  }

  /** Read a whole (small) file: ranged fs.read requests until eof. Returns a Buffer. */
  async #fsRead(path, { maxSize } = {}) {
    const parts = [];
    let offset = 0;
    for (;;) {
      const chunk = await this.request("fs.read", { path, offset, max_size: maxSize });
      parts.push(Buffer.from(chunk.data));
      offset += chunk.data.length;
      if (chunk.eof) return Buffer.concat(parts);
    }
  }

  /** Drain the NATS connection (idempotent). */
  async close() {
    if (!this.nc.isClosed()) await this.nc.drain();
  }
}

function commandFields(command) {
  if (Array.isArray(command)) return { argv: command };
  if (typeof command === "string") return { shell: command };
  throw makeError("bad_request", "command must be an argv array or a shell string");
}
