// cdk.json's "app": runs app.py with a Python that has the project installed, wherever that is.
//
// The CDK CLI runs a .js app that is not executable with the Node.js it runs on itself, so this
// needs no `node` on the PATH. The first of these that can import the CDK libraries wins:
//   1. the active virtualenv ($VIRTUAL_ENV)
//   2. the virtualenv holding the Node.js that runs the CLI (the client install's own Node)
//   3. the project's .venv (scripts/install.sh)
//   4. python3, then python, on the PATH
// app.py's CDK libraries (jsii) then run on that same Node.js.
"use strict";
const { spawnSync } = require("child_process");
const fs = require("fs");
const path = require("path");

const ROOT = path.resolve(__dirname, "..");
const WINDOWS = process.platform === "win32";
const CHECK = "import importlib.util as u, sys; "
  + "sys.exit(0 if all(u.find_spec(m) for m in ('aws_cdk', 'cdk_nag')) else 1)";

function venvPython(dir) {
  return WINDOWS ? path.join(dir, "Scripts", "python.exe") : path.join(dir, "bin", "python");
}

function venvAbove(file) {
  for (let dir = path.dirname(file); path.dirname(dir) !== dir; dir = path.dirname(dir)) {
    if (fs.existsSync(path.join(dir, "pyvenv.cfg"))) return dir;
  }
  return null;
}

function candidates() {
  const found = [];
  if (process.env.VIRTUAL_ENV) found.push(venvPython(process.env.VIRTUAL_ENV));
  const nodeVenv = venvAbove(process.execPath);
  if (nodeVenv) found.push(venvPython(nodeVenv));
  found.push(venvPython(path.join(ROOT, ".venv")));
  found.push("python3", "python");
  return [...new Set(found)];
}

const tried = candidates();
const python = tried.find(
  (exe) => spawnSync(exe, ["-c", CHECK], { cwd: ROOT, stdio: "ignore" }).status === 0);
if (!python) {
  console.error(
    `error: no Python here has the project installed (tried ${tried.join(", ")}). `
    + "Install the client into a virtualenv and activate it: "
    + "python3 -m venv .venv && source .venv/bin/activate && "
    + "python -m pip install -c constraints.txt -e . (README, Deploy).");
  process.exit(1);
}
const env = { ...process.env };
env.JSII_NODE = env.JSII_NODE || process.execPath;
const result = spawnSync(python, [path.join(ROOT, "app.py")], { cwd: ROOT, stdio: "inherit", env });
if (result.error) {
  console.error(`error: could not start ${python}: ${result.error.message}`);
  process.exit(1);
}
if (result.signal) process.kill(process.pid, result.signal);
process.exit(result.status);
