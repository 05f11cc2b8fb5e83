// Live refresh: an element with data-refresh="URL" gets that URL's HTML (a fragment
// the server rendered and escaped) every data-every seconds. A failed fetch keeps the
// last content and marks it stale; the next tick tries again.
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
          element.innerHTML = html;
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
