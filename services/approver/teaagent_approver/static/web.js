// The approver's web inbox: countdowns, the live inbox (server-sent events), the one-time sign-in link.
// No framework, no build step. Cards arrive as HTML the approver rendered and escaped; nothing here
// turns a request's own text into markup, and the page's Content-Security-Policy runs no inline script.
"use strict";

(function () {
  const body = document.body;
  const page = body.dataset.page;
  let skew = Number(body.dataset.serverNow) * 1000 - Date.now(); // the approver's clock minus this one

  function now() {
    return (Date.now() + skew) / 1000;
  }

  function two(n) {
    return String(n).padStart(2, "0");
  }

  // Same words as `teaagent approvals`: 1h 02m, 1m 58s, 45s, expired.
  function timeLeft(seconds) {
    if (seconds <= 0) return "expired";
    const whole = Math.floor(seconds);
    if (whole >= 3600) return `${Math.floor(whole / 3600)}h ${two(Math.floor((whole % 3600) / 60))}m`;
    if (whole >= 60) return `${Math.floor(whole / 60)}m ${two(whole % 60)}s`;
    return `${whole}s`;
  }

  function tick() {
    for (const element of document.querySelectorAll("[data-expires]")) {
      let countdown = element.querySelector(".countdown");
      if (countdown === null) {
        countdown = document.createElement("strong");
        countdown.className = "countdown";
        element.prepend(countdown, " · ");
      }
      const left = Number(element.dataset.expires) - now();
      countdown.textContent = left > 0 ? `${timeLeft(left)} left` : "expired";
      element.classList.toggle("is-expired", left <= 0);
    }
  }

  function say(text) {
    const status = document.getElementById("status");
    if (status === null) return;
    status.hidden = !text;
    status.textContent = text;
  }

  function signIn() {
    if (page !== "login" || !location.hash.startsWith("#code=")) return;
    const code = decodeURIComponent(location.hash.slice("#code=".length));
    history.replaceState(null, "", location.pathname + location.search); // the code works once anyway
    const form = document.getElementById("login");
    document.getElementById("code").value = code;
    form.submit();
  }

  // -- the live inbox ---------------------------------------------------------------------------

  const cards = new Map(); // version -> element

  function card(version, html) {
    let element = cards.get(version);
    if (element === undefined && html !== undefined) {
      const template = document.createElement("template");
      template.innerHTML = html; // the approver's own HTML, every value in it escaped there
      element = template.content.firstElementChild;
      element.dataset.version = version;
      cards.set(version, element);
    }
    return element;
  }

  function place(container, elements) {
    elements.forEach((element, index) => {
      if (container.children[index] !== element) container.insertBefore(element, container.children[index] || null);
    });
    while (container.children.length > elements.length) container.lastElementChild.remove();
  }

  function showProblem(problem) {
    const box = document.getElementById("problem");
    box.replaceChildren();
    if (problem) {
      const notice = document.createElement("div");
      notice.className = "notice notice-error";
      notice.setAttribute("role", "alert");
      notice.textContent = `${problem} The page updates when it answers.`;
      box.append(notice);
    }
  }

  function update(data) {
    skew = data.now * 1000 - Date.now();
    showProblem(data.problem);
    if (data.order === null) return;
    const known = new Set();
    const before = new Set(Array.from(document.querySelectorAll("#pending > article"), (e) => e.dataset.key));
    let arrived = [];
    for (const section of ["pending", "settled"]) {
      const elements = [];
      for (const [key, version] of data.order[section]) {
        const element = card(version, data.cards[version]);
        if (element === undefined) continue;
        known.add(version);
        elements.push(element);
        if (section === "pending" && !before.has(key)) arrived.push(element);
      }
      place(document.getElementById(section), elements);
      document.getElementById(`${section}-empty`).hidden = elements.length > 0;
      if (section === "pending") {
        document.getElementById("pending-count").textContent = `(${elements.length})`;
        document.title = document.title.replace(/^\(\d+\) /, "");
        if (elements.length > 0) document.title = `(${elements.length}) ${document.title}`;
      }
    }
    for (const version of Array.from(cards.keys())) if (!known.has(version)) cards.delete(version);
    if (arrived.length > 0) {
      const names = arrived.map((e) => e.querySelector("h3").textContent);
      say(`New: ${names.join("; ")}`);
    }
    tick();
  }

  function follow() {
    for (const element of document.querySelectorAll("article[data-version]")) {
      cards.set(element.dataset.version, element);
    }
    const events = new EventSource("/web/events");
    events.addEventListener("open", () => say(""));
    events.addEventListener("inbox", (event) => update(JSON.parse(event.data)));
    events.addEventListener("expired", () => {
      events.close();
      expired();
    });
    events.addEventListener("error", () => {
      if (events.readyState === EventSource.CLOSED) {
        expired();
      } else {
        say("Lost this approver; reconnecting…");
      }
    });
  }

  function expired() {
    const status = document.getElementById("status");
    status.hidden = false;
    status.replaceChildren("Your session expired or this approver restarted: ");
    const link = document.createElement("a");
    link.href = "/web/login?expired=1";
    link.textContent = "sign in again";
    status.append(link, ".");
    status.classList.add("is-expired");
  }

  signIn();
  tick();
  setInterval(tick, 1000);
  if (page === "inbox") follow();
  const notice = document.getElementById("notice");
  if (notice !== null) notice.focus();
})();
