/* autoweb charts: draw the server-built plotly figures, follow links on click, and redraw a
 * search's charts live.
 *
 * Every <figure class="chart"> holds its figure as JSON (<script id="chart-KEY-data">), built
 * by searches/charts.py. An empty figure (layout.meta.empty) shows its message, not a plot.
 * Clicking a point whose customdata[0] is a URL opens it (the trial).
 *
 * Live: a chart section with data-live-url is re-fetched (JSON: {"charts": {dom id: figure}})
 * when the search's websocket delivers a judged trial row or a status change; at most one
 * request in flight, and a burst of trials costs one more request, not one each.
 */
(function () {
  "use strict";

  var CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  var JUDGED = /data-status="(kept|reverted|failed)"|id="search-status"/;

  function isEmpty(figure) {
    return Boolean(figure && figure.layout && figure.layout.meta && figure.layout.meta.empty);
  }

  function draw(element, figure) {
    var plot = element.querySelector(".chart-plot");
    var emptyBox = element.querySelector(".chart-empty");
    if (!plot || !window.Plotly) return;
    if (isEmpty(figure)) {
      plot.hidden = true;
      if (emptyBox) {
        emptyBox.hidden = false;
        var message = emptyBox.querySelector(".empty");
        if (message) message.textContent = figure.layout.meta.message || "";
      }
      if (plot.dataset.drawn) {
        window.Plotly.purge(plot);
        delete plot.dataset.drawn;
      }
      element.dataset.state = "empty";
      return;
    }
    if (emptyBox) emptyBox.hidden = true;
    plot.hidden = false;
    window.Plotly.react(plot, figure.data, figure.layout, CONFIG).then(function () {
      element.dataset.state = "drawn";
      element.dataset.revision = String(Number(element.dataset.revision || 0) + 1);
    });
    if (!plot.dataset.drawn) {
      plot.dataset.drawn = "1";
      plot.on("plotly_click", function (event) {
        var point = event && event.points && event.points[0];
        var custom = point && point.customdata;
        var url = Array.isArray(custom) ? custom[0] : null;
        if (typeof url === "string" && url.charAt(0) === "/") window.location.assign(url);
      });
    }
  }

  function drawAll(root) {
    var figures = (root || document).querySelectorAll("figure.chart");
    for (var i = 0; i < figures.length; i++) {
      var element = figures[i];
      if (element.dataset.state) continue;
      var data = document.getElementById(element.id + "-data");
      if (!data) continue;
      try {
        draw(element, JSON.parse(data.textContent));
      } catch (error) {
        element.dataset.state = "error";
        console.error("chart " + element.id + " failed to draw", error);
      }
    }
  }

  // -- live --------------------------------------------------------------------------------------

  var inFlight = false;
  var again = false;

  function refresh() {
    var sections = document.querySelectorAll(".charts[data-live-url]");
    if (!sections.length) return;
    if (inFlight) {
      again = true;
      return;
    }
    inFlight = true;
    var section = sections[0];
    fetch(section.dataset.liveUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (body) {
        var figures = body.charts || {};
        Object.keys(figures).forEach(function (id) {
          var element = document.getElementById(id);
          if (element) draw(element, figures[id]);
        });
      })
      .catch(function (error) {
        console.warn("live chart update failed", error);
      })
      .then(function () {
        inFlight = false;
        if (again) {
          again = false;
          window.setTimeout(refresh, 250);
        }
      });
  }

  document.addEventListener("htmx:wsAfterMessage", function (event) {
    var message = event.detail && event.detail.message;
    if (typeof message === "string" && JUDGED.test(message)) refresh();
  });

  function start() {
    drawAll(document);
    if (window.htmx) {
      window.htmx.onLoad(function (element) {
        drawAll(element);
      });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }

  window.autowebCharts = { draw: draw, drawAll: drawAll, refresh: refresh };
})();
