// The three live panes (the user's transcript, the back-end's answer as fed
// to the voice model, the assistant's speech). DOM only: app.js decides
// what to show, this module decides how.

const MAX_ENTRIES = 60; // older entries are dropped, the page runs for hours

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function seconds(ms) {
  return `${(Math.abs(ms) / 1000).toFixed(2)} s`;
}

class Log {
  constructor(root) {
    this.root = root;
    this.placeholder = root.querySelector(".empty");
    this.entries = new Map();
  }

  add(key, node) {
    node.dataset.id = key; // the server's item / request / response id
    if (this.placeholder) this.placeholder.hidden = true;
    const stick = this.atBottom();
    this.root.append(node);
    this.entries.set(key, node);
    while (this.entries.size > MAX_ENTRIES) {
      const [oldKey, old] = this.entries.entries().next().value;
      old.remove();
      this.entries.delete(oldKey);
    }
    if (stick) this.scroll();
    return node;
  }

  get(key) {
    return this.entries.get(key);
  }

  remove(key) {
    const node = this.entries.get(key);
    if (node) node.remove();
    this.entries.delete(key);
    if (!this.entries.size && this.placeholder) this.placeholder.hidden = false;
  }

  clear() {
    for (const node of this.entries.values()) node.remove();
    this.entries.clear();
    if (this.placeholder) this.placeholder.hidden = false;
  }

  atBottom() {
    return this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 24;
  }

  scroll() {
    this.root.scrollTop = this.root.scrollHeight;
  }

  // Keep following the newest text while the reader is at the bottom.
  touched(fn) {
    const stick = this.atBottom();
    fn();
    if (stick) this.scroll();
  }
}

export class Panes {
  constructor({ user, oracle, assistant }) {
    this.user = new Log(user);
    this.oracle = new Log(oracle);
    this.assistant = new Log(assistant);
  }

  clear() {
    this.user.clear();
    this.oracle.clear();
    this.assistant.clear();
  }

  // ---- the user's turns: stable words, then the tail that may still change
  userTurn(id) {
    let node = this.user.get(id);
    if (!node) {
      node = el("p", "turn live");
      node.append(el("span", "stable"), el("span", "tail", "…"));
      this.user.add(id, node);
    }
    return node;
  }

  userPartial(id, text, stable) {
    const node = this.userTurn(id);
    const tail = text.startsWith(stable) ? text.slice(stable.length) : text;
    this.user.touched(() => {
      node.querySelector(".stable").textContent = text.startsWith(stable) ? stable : "";
      node.querySelector(".tail").textContent = tail || (stable ? "" : "…");
    });
  }

  userStopped(id) {
    this.userTurn(id).classList.add("stopped");
  }

  userFinal(id, transcript) {
    if (!transcript.trim()) {
      this.user.remove(id); // a noise the VAD took for speech
      return;
    }
    const node = this.userTurn(id);
    this.user.touched(() => {
      node.classList.remove("live", "stopped");
      node.querySelector(".stable").textContent = transcript;
      node.querySelector(".tail").textContent = "";
    });
  }

  userFailed(id) {
    const node = this.user.get(id);
    if (node) {
      node.classList.remove("live");
      node.querySelector(".tail").textContent = " (transcription failed)";
    }
  }

  // ---- the back-end's answers, one entry per request that reached the oracle
  oracleEntry(requestId, backend) {
    let node = this.oracle.get(requestId);
    if (!node) {
      node = el("article", "answer live");
      const meta = el("p", "meta");
      meta.append(el("span", "badge", backend || "back-end"), el("span", "when"), el("span", "status"));
      node.append(meta, el("p", "text"));
      this.oracle.add(requestId, node);
      for (const other of this.oracle.entries.values()) if (other !== node) other.classList.remove("live");
    }
    return node;
  }

  oracleText(requestId, backend, text) {
    const node = this.oracleEntry(requestId, backend);
    this.oracle.touched(() => {
      node.querySelector(".text").textContent = text;
    });
  }

  // A tool call the back-end made for this request: one line per call, updated when it finishes.
  oracleTool(requestId, backend, callId, name, label, kind = "") {
    const node = this.oracleEntry(requestId, backend);
    this.oracle.touched(() => {
      let list = node.querySelector(".tools");
      if (!list) {
        list = el("ul", "tools");
        node.insertBefore(list, node.querySelector(".text"));
      }
      let item = [...list.children].find((li) => li.dataset.callId === callId);
      if (!item) {
        item = el("li", "tool");
        item.dataset.callId = callId;
        item.append(el("code", "name", name), el("span", "state"));
        list.append(item);
      }
      const state = item.querySelector(".state");
      state.textContent = label;
      state.dataset.kind = kind;
    });
  }

  oracleWhen(requestId, label) {
    const node = this.oracle.get(requestId);
    if (node) node.querySelector(".when").textContent = label;
  }

  oracleStatus(requestId, label, kind = "") {
    const node = this.oracle.get(requestId);
    if (!node) return;
    const s = node.querySelector(".status");
    s.textContent = label;
    s.dataset.kind = kind;
    if (kind === "done" || kind === "bad") node.classList.remove("live");
  }

  oracleCleared() {
    for (const node of this.oracle.entries.values()) {
      if (node.classList.contains("live")) {
        node.classList.remove("live");
        node.classList.add("cleared");
      }
    }
  }

  // ---- the assistant's speech, one entry per response
  assistantText(responseId, piece) {
    let node = this.assistant.get(responseId);
    if (!node) node = this.assistant.add(responseId, el("p", "turn live"));
    this.assistant.touched(() => {
      node.textContent += piece;
    });
  }

  assistantDone(responseId, transcript) {
    const node = this.assistant.get(responseId);
    if (!node) return;
    if (!transcript.trim()) this.assistant.remove(responseId);
    else {
      node.textContent = transcript;
      node.classList.remove("live");
    }
  }
}
