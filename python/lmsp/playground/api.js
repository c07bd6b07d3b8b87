// The service's HTTP API, same-origin. A token, when the service has tokens, lives in this
// tab's sessionStorage only: gone when the tab closes, never readable by another origin.

const TOKEN_KEY = "lmsp.token";

export class ProblemError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem.code;
    this.param = problem.param;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function authHeaders() {
  const t = token();
  return t ? { authorization: `Bearer ${t}` } : {};
}

// crypto.randomUUID needs a secure context; a service on a LAN address over plain HTTP is not one.
function randomKey() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function call(method, path, body) {
  const headers = { "lmsp-version": "1.0", ...authHeaders() };
  const init = { method, headers };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    // A retry of this POST (ours or the browser's) can never make a second task.
    headers["idempotency-key"] = randomKey();
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json();
  if (!response.ok) throw new ProblemError(response.status, data);
  return data;
}

export const listModels = () => call("GET", "/lmsp/v1/models");
export const createTask = (request) => call("POST", "/lmsp/v1/tasks", request);
export const getTask = (id) => call("GET", `/lmsp/v1/tasks/${encodeURIComponent(id)}`);
export const cancelTask = (id) => call("POST", `/lmsp/v1/tasks/${encodeURIComponent(id)}/cancel`);
