// Live refresh: an element with data-refresh="URL" gets that URL's HTML (a fragment
// the server rendered and escaped) every data-every seconds. A failed fetch keeps the
// last content and marks it stale; the next tick tries again. Once replaced, the
// element fires "dashboard:refreshed" (sort.js sorts its tables again), and a control
// with data-focus that had the focus gets it back in the new content.
(function () {
  "use strict";
  function start(element) {
    var url = element.getAttribute("data-refresh");
    var every = Math.max(Number(element.getAttribute("data-every")) || 5, 1) * 1000;
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (!response.ok) { throw new Error(String(response.status)); }
          return response.text();
        })
        .then(function (html) {
          var active = document.activeElement;
          var focused = active && element.contains(active) ? active.getAttribute("data-focus") : null;
          element.innerHTML = html;
          element.dispatchEvent(new CustomEvent("dashboard:refreshed", { bubbles: true }));
          if (focused) {
            element.querySelectorAll("[data-focus]").forEach(function (control) {
              if (control.getAttribute("data-focus") === focused) { control.focus(); }
            });
          }
          element.classList.remove("stale");
          element.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function () { element.classList.add("stale"); })
        .then(function () { window.setTimeout(tick, every); });
    }
    window.setTimeout(tick, every);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(start);
  });
})();

// A bulk operation's page: an element with data-operation="URL" (its JSON) and
// data-finished="no" polls that URL every second, moves the progress bar and the
// counts (as text), and reloads the page once the operation has finished: the server
// renders the result. A failed poll marks it stale; the next one tries again.
(function () {
  "use strict";
  var EVERY = 1000;
  function show(element, operation) {
    var bar = element.querySelector("progress");
    var done = element.querySelector("[data-field=done]");
    var total = element.querySelector("[data-field=total]");
    if (done) { done.textContent = String(operation.done); }
    if (operation.total !== null) {
      if (bar) {
        bar.max = Math.max(operation.total, 1);
        bar.value = operation.done;
        bar.textContent = operation.done + " of " + operation.total;
      }
      if (total) { total.textContent = String(operation.total); }
      var ofTotal = element.querySelector("#of-total");
      if (ofTotal) { ofTotal.hidden = false; }
    }
  }
  function follow(element) {
    var url = element.getAttribute("data-operation");
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          if (response.status === 404) { return { finished: true }; } // forgotten: the page says so
          if (!response.ok) { throw new Error(String(response.status)); }
          return response.json();
        })
        .then(function (operation) {
          element.classList.remove("stale");
          if (operation.finished) {
            window.location.reload();
            return;
          }
          show(element, operation);
          window.setTimeout(tick, EVERY);
        })
        .catch(function () {
          element.classList.add("stale");
          window.setTimeout(tick, EVERY);
        });
    }
    window.setTimeout(tick, EVERY);
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-operation][data-finished=no]").forEach(follow);
  });
})();
