// The playground: a conversation with one model, each answer a task followed through its
// resumable events (events.js), kept as a conversation with previous_response_id.

import { ProblemError, cancelTask, createTask, getTask, listModels, setToken, token } from "./api.js";
import { followTask } from "./events.js";
import { addError, addTurn, callCard, showJson, thinkingCard } from "./log.js";

const $ = (id) => document.getElementById(id);
const FINAL = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);
const NEEDS = { json: "structured_output", tools: "tools" };

let models = [];
let previousResponseId = null; // the last answer the next request continues from
let running = null; // the answer being streamed

// A counter the page keeps of Content-Security-Policy violations (there should be none).
document.documentElement.dataset.cspViolations = "0";
document.addEventListener("securitypolicyviolation", (e) => {
  const html = document.documentElement;
  html.dataset.cspViolations = String(Number(html.dataset.cspViolations) + 1);
  console.error(`CSP violation: ${e.violatedDirective} ${e.blockedURI}`);
});

function setState(text) {
  $("state").textContent = text;
}

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

function currentModel() {
  return models.find((m) => m.id === $("model").value);
}

function showSettingsError(text, field) {
  $("settings-error").textContent = text;
  if (field) {
    $("settings").open = true;
    field.setAttribute("aria-invalid", "true");
    field.focus();
  }
}

// --- models and tokens ---------------------------------------------------------------------

async function loadModels() {
  try {
    models = (await listModels()).data;
  } catch (error) {
    if (error instanceof ProblemError && error.status === 401) {
      askToken(token() ? error.message : "");
      return;
    }
    setState(`Could not list the models: ${error.message}`);
    return;
  }
  $("token-form").hidden = true;
  $("main").hidden = false;
  $("token-change").hidden = !token();
  const select = $("model");
  select.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  select.disabled = models.length === 0;
  showCapabilities();
  setState(models.length ? "Ready" : "No models");
  updateButtons();
}

function askToken(message) {
  $("main").hidden = true;
  $("token-form").hidden = false;
  $("token-error").textContent = message;
  $("token").focus();
}

function showCapabilities() {
  const model = currentModel();
  const caps = model ? model.capabilities : [];
  const badges = caps.map((c) => badge(c));
  if (model) badges.push(badge(`context ${model.context_window}`), badge(model.device));
  $("capabilities").replaceChildren(...badges);
  for (const [value, needed] of Object.entries(NEEDS)) {
    const radio = $(`mode-${value}`);
    radio.disabled = !caps.includes(needed);
    if (radio.disabled && radio.checked) document.querySelector('input[value="chat"]').checked = true;
  }
  showMode();
}

function badge(text) {
  const li = document.createElement("li");
  li.textContent = text;
  return li;
}

function showMode() {
  $("schema-field").hidden = mode() !== "json";
  $("tool-fields").hidden = mode() !== "tools";
}

// --- building requests ---------------------------------------------------------------------

function parseField(id, what) {
  const field = $(id);
  field.removeAttribute("aria-invalid");
  try {
    return JSON.parse(field.value);
  } catch (error) {
    showSettingsError(`The ${what} is not JSON: ${error.message}`, field);
    return undefined;
  }
}

function baseRequest(input) {
  const model = currentModel();
  const request = { model: model.id, input };
  const temperature = $("temperature").valueAsNumber;
  const maxTokens = $("max-tokens").valueAsNumber;
  if (!Number.isNaN(temperature)) request.temperature = temperature;
  if (!Number.isNaN(maxTokens)) request.max_output_tokens = maxTokens;
  if (model.capabilities.includes("conversations")) {
    request.store = true;
    if (previousResponseId) request.previous_response_id = previousResponseId;
  }
  return request;
}

// The request for a prompt in the chosen mode; undefined when a setting is not usable.
function promptRequest(text) {
  $("settings-error").textContent = "";
  const request = baseRequest([{ type: "message", role: "user", content: [{ type: "input_text", text }] }]);
  if (mode() === "json") {
    const schema = parseField("schema", "schema");
    if (schema === undefined) return undefined;
    request.response_format = { type: "json_schema", json_schema: { name: "answer", schema } };
  } else if (mode() === "tools") {
    const tool = parseField("tool", "tool definition");
    if (tool === undefined) return undefined;
    request.tools = [{ type: "function", ...tool }];
    request.tool_choice = $("tool-choice").value;
  }
  return request;
}

// A tool's result, typed into its call's card, continues the conversation.
function sendResult(tools, callId, output) {
  if (running) return false;
  addTurn("tool", output);
  const request = baseRequest([{ type: "function_call_output", call_id: callId, output }]);
  request.tools = tools;
  // `required` would only call again; after a result the model answers.
  request.tool_choice = $("tool-choice").value === "required" ? "none" : $("tool-choice").value;
  start(request);
  return true;
}

// --- one answer ----------------------------------------------------------------------------

async function start(request) {
  const begun = performance.now();
  running = { taskId: null, follower: null, lastId: 0, items: new Map(), begun, firstAt: null, deltas: 0, request };
  $("ttft").textContent = "–";
  $("rate").textContent = "–";
  setState("Sending…");
  updateButtons();
  let task;
  try {
    task = await createTask(request);
  } catch (error) {
    running = null;
    addError(problemText(error));
    setState("Ready");
    updateButtons();
    if (error instanceof ProblemError && error.status === 401) askToken(error.message); // revoked meanwhile
    return;
  }
  running.taskId = task.id;
  document.documentElement.dataset.taskId = task.id;
  setState("Generating…");
  updateButtons();
  const answer = running;
  running.follower = followTask(task.id, {
    onEvent: (id, name, data) => answer === running && onEvent(id, name, data),
    onOpen: () => answer === running && setState("Generating…"),
    onReconnecting: () => answer === running && setState("Connection lost: reconnecting…"),
    onEnded: () => answer === running && recover(),
  });
}

function onEvent(id, name, data) {
  const r = running;
  // Resumes send only what came after the last id: a repeat or a gap is a bug somewhere.
  if (id <= r.lastId) {
    console.error(`event ${id} came again (the last was ${r.lastId})`);
    return;
  }
  if (id !== r.lastId + 1) console.error(`events ${r.lastId + 1}..${id - 1} never came`);
  r.lastId = id;
  if (name === "response.created") {
    r.responseId = data.response_id;
  } else if (name === "response.output_item.added") {
    added(data.item);
  } else if (
    name === "response.output_text.delta" ||
    name === "response.function_call_arguments.delta" ||
    name === "response.reasoning_summary_text.delta"
  ) {
    const entry = r.items.get(data.item_id);
    if (entry) {
      // Someone reading at the bottom keeps seeing the newest text; one who scrolled up stays put.
      const atBottom = innerHeight + scrollY >= document.documentElement.scrollHeight - 200;
      entry.text.appendData(data.delta);
      if (atBottom) entry.li.scrollIntoView({ block: "end" });
    }
    if (name === "response.output_text.delta") countToken();
  } else if (name === "response.output_item.done") {
    done(data.item);
  } else if (FINAL.has(name)) {
    finish(name.slice("response.".length), data);
  } else if (name === "error") {
    // This stream cannot go on (the service is stopping, say); the task says how the answer ends.
    r.follower.close();
    recover();
  }
}

function added(item) {
  if (item.type === "reasoning") {
    const li = thinkingCard();
    li.setAttribute("aria-busy", "true");
    running.items.set(item.id, { li, text: li.querySelector(".text").appendChild(document.createTextNode("")) });
  } else if (item.type === "message") {
    const li = addTurn("assistant", "");
    li.setAttribute("aria-busy", "true");
    running.items.set(item.id, { li, text: li.querySelector(".text").appendChild(document.createTextNode("")) });
  } else if (item.type === "function_call") {
    const tools = running.request.tools;
    const li = callCard(item, (callId, output) => sendResult(tools, callId, output));
    li.setAttribute("aria-busy", "true");
    running.items.set(item.id, { li, text: li.querySelector(".call-arguments").appendChild(document.createTextNode("")) });
  }
}

function itemText(item) {
  if (item.type === "reasoning") return item.summary.map((p) => p.text ?? "").join("");
  return item.type === "message" ? item.content.map((p) => p.text ?? "").join("") : item.arguments;
}

function done(item) {
  const entry = running.items.get(item.id);
  if (!entry) return;
  entry.li.removeAttribute("aria-busy");
  if (entry.text.data !== itemText(item)) console.error(`the streamed text of ${item.id} differs from the item`);
  if (item.type === "function_call") {
    entry.li.dataset.callId = item.call_id;
    try {
      entry.text.data = JSON.stringify(JSON.parse(item.arguments), null, 2);
    } catch {
      // an incomplete call's arguments stay as they came
    }
    if (item.status === "completed") entry.li.querySelector("form").hidden = false;
  }
  entry.item = item;
}

function countToken() {
  const r = running;
  const now = performance.now();
  r.deltas += 1;
  if (r.firstAt === null) {
    r.firstAt = now;
    $("ttft").textContent = `${Math.round(now - r.begun)} ms`;
  } else {
    $("rate").textContent = ((r.deltas - 1) / ((now - r.firstAt) / 1000)).toFixed(1);
  }
}

function finish(status, data) {
  const r = running;
  r.follower?.close();
  running = null;
  const end = performance.now();
  const tokens = data.usage?.output_tokens;
  if (tokens > 1 && r.firstAt !== null && end > r.firstAt) {
    $("rate").textContent = ((tokens - 1) / ((end - r.firstAt) / 1000)).toFixed(1);
  }
  for (const entry of r.items.values()) {
    entry.li.removeAttribute("aria-busy");
    entry.li.dataset.responseId = r.responseId;
    if (r.request.response_format && entry.item?.type === "message") showJson(entry.li, entry.text.data, status);
  }
  let note = status;
  if (status === "incomplete") note += ` (${data.incomplete_details?.reason ?? "cut short"})`;
  if (data.error) {
    addError(`${data.error.code}: ${data.error.detail}`);
    note += `: ${data.error.code}`;
  }
  const html = document.documentElement.dataset;
  html.responseId = r.responseId ?? "";
  html.status = status;
  if ((status === "completed" || status === "incomplete") && r.request.store) previousResponseId = r.responseId;
  setState(`Answer ${note}`);
  updateButtons();
  $("prompt").focus();
}

// The stream ended before its final event (its history expired, the service restarted or
// is stopping, the task is unknown): the task itself says how the answer ends. While the
// service cannot be reached or answers 503 (stopping), ask again; any other refusal ends it.
async function recover() {
  const r = running;
  setState("Reading the task…");
  for (;;) {
    let task = null;
    try {
      task = await getTask(r.taskId);
    } catch (error) {
      if (error instanceof ProblemError && error.status !== 503) {
        finish("failed", { error: { code: error.code, detail: error.message } });
        return;
      }
      setState("The service cannot be reached: trying again…");
    }
    if (r !== running) return;
    if (task?.response) {
      r.responseId = task.response.id;
      for (const item of task.response.output) {
        if (!r.items.has(item.id)) added(item);
        const entry = r.items.get(item.id);
        if (entry) entry.text.data = itemText(item);
        done(item);
      }
      finish(task.response.status, task.response);
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function problemText(error) {
  if (error instanceof ProblemError) return `${error.code}${error.param ? ` (${error.param})` : ""}: ${error.message}`;
  return `The request failed: ${error.message}`;
}

async function stop() {
  const r = running;
  if (!r?.taskId) return;
  $("stop").disabled = true;
  setState("Stopping…");
  try {
    await cancelTask(r.taskId); // the stream then ends with response.cancelled
  } catch (error) {
    addError(problemText(error));
  }
}

function updateButtons() {
  const ready = !running && models.length > 0;
  $("send").disabled = !ready;
  $("stop").disabled = !running?.taskId;
  $("model").disabled = !ready;
}

// --- wiring --------------------------------------------------------------------------------

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  const request = promptRequest(text);
  if (!request) return;
  addTurn("user", text);
  $("prompt").value = "";
  start(request);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && running) stop();
});
$("stop").addEventListener("click", stop);
$("new").addEventListener("click", () => {
  if (running) return;
  previousResponseId = null;
  $("log").replaceChildren();
  setState("New conversation");
  $("prompt").focus();
});
$("model").addEventListener("change", () => {
  previousResponseId = null; // a conversation belongs to one model's context
  showCapabilities();
});
for (const radio of document.querySelectorAll('input[name="mode"]')) radio.addEventListener("change", showMode);
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("token").value.trim());
  $("token").value = "";
  loadModels();
});
$("token-change").addEventListener("click", () => {
  setToken(null);
  askToken("");
});

// On a narrow screen the settings start folded: the conversation gets the room.
if (matchMedia("(max-width: 32rem)").matches) $("settings").open = false;
loadModels();
