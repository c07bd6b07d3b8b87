// The conversation log: turns, errors, JSON answers and function-call cards.

const log = () => document.getElementById("log");

export function addTurn(role, text) {
  const li = document.createElement("li");
  li.className = `turn ${role}`;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : role === "tool" ? "Tool result" : "Model";
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  li.append(who, body);
  log().append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

// A thinking model's thinking: folded above its answer, open to read.
export function thinkingCard() {
  const li = document.createElement("li");
  li.className = "turn thinking";
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const body = document.createElement("div");
  body.className = "text";
  details.append(summary, body);
  li.append(details);
  log().append(li);
  return li;
}

export function addError(text) {
  const li = addTurn("note", text);
  li.classList.add("error");
  li.querySelector(".who").textContent = "Error";
  return li;
}

export function showJson(li, text, status) {
  const verdict = document.createElement("p");
  verdict.className = "verdict";
  try {
    const pre = document.createElement("pre");
    pre.className = "json";
    pre.textContent = JSON.stringify(JSON.parse(text), null, 2);
    li.append(pre);
    li.classList.add("has-json");
    verdict.textContent = "✓ valid JSON, held to the schema by the service's constrained sampling";
    verdict.classList.add("valid");
  } catch {
    verdict.textContent = `✗ not JSON${status === "incomplete" ? " (the answer was cut short)" : ""}`;
    verdict.classList.add("invalid");
  }
  li.append(verdict);
}

// A call's card; its form (shown once the call is complete) hands the typed result to
// onResult(callId, output), which returns false when it cannot be sent now.
export function callCard(item, onResult) {
  const li = document.getElementById("call-card").content.firstElementChild.cloneNode(true);
  li.querySelector(".call-name").textContent = item.name;
  li.dataset.callId = item.call_id;
  const form = li.querySelector("form");
  form.hidden = true;
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const output = form.querySelector("textarea").value;
    if (onResult(li.dataset.callId, output) === false) return;
    form.querySelector("button").disabled = true;
    form.querySelector("textarea").readOnly = true;
  });
  log().append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}
