// A command-line driver of sandpod.mjs for tests and humans: one operation, JSON in, JSON out.
// Usage: node cli.mjs <nats-url> <sandbox> <op> '<json args>'
//   exec   {argv|shell, cwd?, env?, stdin_b64?, timeout?}   -> {exit_code, signal, timed_out, stdout_b64, stderr_b64}
//   stream {argv|shell, ..., window?}                        -> exit fields + per stream {bytes, sha256}, chunks
//   write  {path, data_b64}                                  -> the fs.entry
//   read   {path}                                            -> {data_b64}
// A SandpodError prints {"error": {code, known, retryable, message, classes}} and exits 3.
import { createHash } from "node:crypto";
import { jsonView } from "./codec.mjs";
import { Sandbox, SandpodError, errorClass } from "./sandpod.mjs";

const [url, sandboxId, op, argsJson = "{}"] = process.argv.slice(2);
const args = JSON.parse(argsJson);
const command = args.argv ?? args.shell;
const b64 = (buf) => buf.toString("base64");
const stdin = args.stdin_b64 === undefined ? undefined : Buffer.from(args.stdin_b64, "base64");
const options = { cwd: args.cwd, env: args.env, stdin, timeout: args.timeout, window: args.window };

async function run(sbx) {
  switch (op) {
    case "exec": {
      const r = await sbx.exec(command, options);
      return { exit_code: r.exitCode, signal: r.signal, timed_out: r.timedOut, stdout_b64: b64(r.stdout), stderr_b64: b64(r.stderr) };
    }
    case "stream": {
      const hashes = { stdout: createHash("sha256"), stderr: createHash("sha256") };
      const bytes = { stdout: 0, stderr: 0 };
      let chunks = 0;
      const exit = await sbx.execStream(command, (stream, data) => {
        hashes[stream].update(data);
        bytes[stream] += data.length;
        chunks += 1;
      }, options);
      const streams = Object.fromEntries(["stdout", "stderr"].map((s) => [s, { bytes: bytes[s], sha256: hashes[s].digest("hex") }]));
      return { exit_code: exit.exitCode, signal: exit.signal, timed_out: exit.timedOut, stdout_size: exit.stdoutSize, stderr_size: exit.stderrSize, chunks, ...streams };
    }
    case "write":
      return jsonView(await sbx.fs.write(args.path, Buffer.from(args.data_b64, "base64")));
    case "read":
      return { data_b64: b64(await sbx.fs.read(args.path)) };
    default:
      throw new Error(`unknown op ${op}`);
  }
}

function classesOf(err) {
  const names = [];
  for (const code of ["exec.spawn_failed", "exec.error", "sandbox.error", "bad_request"]) {
    if (err instanceof errorClass(code)) names.push(code);
  }
  return names;
}

let sbx;
try {
  sbx = await Sandbox.connect(sandboxId, { servers: url });
  console.log(JSON.stringify(await run(sbx)));
} catch (err) {
  if (!(err instanceof SandpodError)) throw err;
  const error = { code: err.code, known: err.known, retryable: err.retryable, message: err.message, details: err.details, classes: classesOf(err) };
  console.log(JSON.stringify({ error }));
  process.exitCode = 3;
} finally {
  await sbx?.close();
}
