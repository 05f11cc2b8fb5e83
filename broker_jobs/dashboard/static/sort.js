// Sortable tables: in a table with data-sortable, each header cell with text becomes
// a button (keyboard reachable; the th carries aria-sort) that sorts the body's rows
// by that column, ascending, then descending on the next press. A cell sorts by its
// data-sort attribute, else the datetime of a <time> in it, else its text; numbers
// (and times) as numbers, other text in natural order, empty cells ("-", "") last.
// Rows are only moved, never rewritten: their content stays the server's (escaped).
// Without scripts the tables stay in the server's order.
//
// A live region (refresh.js) replaces its tables every few seconds: it then fires
// "dashboard:refreshed", and the new tables are sorted as the old ones were.
(function () {
  "use strict";
  var EMPTY = { "": true, "-": true };
  // table key -> { column: index, descending: bool }, kept across refreshes.
  var chosen = {};

  function tableKey(table) {
    if (table.id) { return table.id; }
    var all = document.querySelectorAll("table[data-sortable]");
    return "table-" + Array.prototype.indexOf.call(all, table);
  }

  function sortValue(cell) {
    var text;
    if (!cell) { return { group: 2, number: 0, text: "" }; }
    if (cell.hasAttribute("data-sort")) {
      text = cell.getAttribute("data-sort").trim();
    } else {
      var time = cell.querySelector("time[datetime]");
      text = time ? time.getAttribute("datetime") : cell.textContent.trim();
    }
    if (EMPTY[text] === true) { return { group: 2, number: 0, text: "" }; }
    var number = Number(text.replace(/,/g, ""));
    if (!isFinite(number) && /^\d{4}-\d\d-\d\dT/.test(text)) { number = Date.parse(text); }
    if (isFinite(number)) { return { group: 0, number: number, text: text }; }
    return { group: 1, number: 0, text: text };
  }

  function compare(a, b) {
    if (a.group !== b.group) { return 0; } // the groups' order is kept by the caller
    if (a.group === 0) { return a.number - b.number; }
    return a.text.localeCompare(b.text, undefined, { numeric: true, sensitivity: "base" });
  }

  function rowsOf(table) {
    var body = table.tBodies[0];
    if (!body) { return []; }
    return Array.prototype.filter.call(body.rows, function (row) {
      return !row.querySelector("td[colspan]"); // "no jobs match" and the like
    });
  }

  function apply(table, column, descending) {
    var body = table.tBodies[0];
    var rows = rowsOf(table);
    var keyed = rows.map(function (row, index) {
      return { row: row, index: index, value: sortValue(row.cells[column]) };
    });
    keyed.sort(function (a, b) {
      if (a.value.group !== b.value.group) { return a.value.group - b.value.group; }
      var order = compare(a.value, b.value);
      if (descending && a.value.group !== 2) { order = -order; }
      return order || a.index - b.index; // ties keep the server's order
    });
    keyed.forEach(function (item) { body.appendChild(item.row); });
    var headers = table.tHead ? table.tHead.rows[0].cells : [];
    Array.prototype.forEach.call(headers, function (th, index) {
      var button = th.querySelector("button.sort");
      if (!button) { return; }
      var mark = button.querySelector(".sort-mark");
      if (index === column) {
        th.setAttribute("aria-sort", descending ? "descending" : "ascending");
        mark.textContent = descending ? " ▼" : " ▲";
      } else {
        th.removeAttribute("aria-sort");
        mark.textContent = "";
      }
    });
  }

  function enhance(table) {
    if (table.getAttribute("data-sort-ready") === "yes" || !table.tHead) { return; }
    table.setAttribute("data-sort-ready", "yes");
    var key = tableKey(table);
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, column) {
      var label = th.textContent.trim();
      if (!label || th.querySelector("a, button, input")) { return; }
      var button = document.createElement("button");
      button.type = "button";
      button.className = "sort";
      button.setAttribute("data-focus", "sort:" + key + ":" + column);
      button.title = "Sort by " + label;
      button.textContent = label;
      var mark = document.createElement("span");
      mark.className = "sort-mark";
      mark.setAttribute("aria-hidden", "true");
      button.appendChild(mark);
      th.textContent = "";
      th.appendChild(button);
      button.addEventListener("click", function () {
        var now = chosen[key];
        var descending = !!(now && now.column === column && !now.descending);
        chosen[key] = { column: column, descending: descending };
        apply(table, column, descending);
      });
    });
    var kept = chosen[key];
    if (kept) { apply(table, kept.column, kept.descending); }
  }

  function enhanceWithin(root) {
    var tables = root.querySelectorAll("table[data-sortable]");
    Array.prototype.forEach.call(tables, enhance);
  }

  document.addEventListener("DOMContentLoaded", function () { enhanceWithin(document); });
  document.addEventListener("dashboard:refreshed", function (event) {
    enhanceWithin(event.target);
  });
})();
